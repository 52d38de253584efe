"""The wire side of the PS: the messages (protocol), their signing (auth) and transport, what a
client checks and routes before a request leaves (requests), what a shard accepts in one
(checks), and how a request's replies merge (replies). Nothing here holds rows."""
