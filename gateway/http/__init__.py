"""The server's HTTP listeners (Prometheus metrics, RabbitMQ's HTTP API) on one bounded stack."""
