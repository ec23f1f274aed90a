"""Webhooks delivered from the log: subscriptions (PostgreSQL), the SSRF guard, Standard
Webhooks signatures, the deliverer (`sessionstream webhooks run`) and redelivery
(docs/webhooks.md)."""
