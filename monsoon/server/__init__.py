"""The parameter server's core, with no transport (docs/design.md's middle
layer): ``core.ServerCore`` applies an update (versions, staleness, the
reader's memory, ``on_read``, the rule, the non-finite drop), ``clocks``
holds SSP's clock table, and ``reduce`` the synchronous step's sum that
every engine shares bit for bit. An engine brings how a request travels,
its locks and its clock (``engines/``)."""
