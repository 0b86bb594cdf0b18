"""The monitoring mixin: alert and recording rules, and Grafana dashboards, from one source.

``config.DEFAULTS`` holds every threshold; ``rules.build`` assembles ``alerts/`` (by area),
``render.dashboards`` the ``dashboards/`` modules; ``python3 -m rankscope.mixin`` writes them."""
