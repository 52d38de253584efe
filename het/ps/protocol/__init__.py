"""What both sides of the PS share, and nothing that holds or serves rows: the messages
(``messages``: ops, header, arrays, errors), their signing (``auth``) and transport, the rules a
request's fields keep (``checks``, ``limits``), the wire's integers, how keys spread over shards
(``partition``), half-precision rows (``halves``), the initial row of a key no push touched
(``initial``) and where a save sits on disk (``layout``). A worker imports this and
:mod:`het.ps.client`; a shard this and :mod:`het.ps.server`."""
