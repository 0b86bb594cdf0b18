"""The monitoring mixin: alert and recording rules, and Grafana dashboards, from one source.

``config.DEFAULTS`` holds every threshold and selector; ``alerts/`` the rules by area, which
``rules.build(config)`` assembles into the rule file; ``dashboards/`` one module per
dashboard, which ``render.dashboards(config)`` assembles; ``python3 -m rankscope.mixin``
writes them to alerts/ and dashboards/ and, through ``helm``, into the chart.
"""
