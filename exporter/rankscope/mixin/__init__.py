"""The monitoring mixin: alert and recording rules, and Grafana dashboards, from one source.

``config.DEFAULTS`` holds every threshold and selector, ``rules.build(config)`` the rule
file, ``dashboards.build()`` the dashboards; ``python3 -m rankscope.mixin`` writes them to
alerts/ and dashboards/ (and, where the Helm sync is present, into the chart).
"""
