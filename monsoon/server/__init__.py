"""The parameter server's core, with no transport (docs/design.md's middle
layer): ``core.ServerCore`` applies an update (versions, staleness, the
reader's memory, ``on_read``, the rule, the non-finite drop), ``clocks``
holds SSP's clock table, ``reduce`` the synchronous step's sum that
every engine shares bit for bit (``kernels``: its mean compiled, the same
bits), ``shards`` how the parameters are split into shards (or replicated
in every worker), and ``worker`` the worker's interpreter of
the ops. An engine brings how a request travels, its locks and its clock
(``engines/``)."""
