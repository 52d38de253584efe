"""The worker's side of the PS: :class:`~het.ps.client.client.PSClient` (the verbs, ps-lite
style), what is checked and routed before a request leaves (``requests``), the connection to
every shard with its requests in flight (``connection``), how a request's replies merge
(``replies``) and the native path of the hottest requests (``hot``). It imports nothing of
:mod:`het.ps.server`."""
