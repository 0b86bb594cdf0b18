"""The host daemon, `rankscope serve`: reads the flight directory, samples the cards, and
publishes everything from the one metric catalog over HTTP (Prometheus, JSON API, status
page) and, when asked, OTLP."""
