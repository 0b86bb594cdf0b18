"""The corridor: a card's worst-instant free memory against its floor."""

from rankscope.mixin.alerts import Alert

RECORDING = {
    # Worst instant of the sampler's window against the card's floor; signed.
    "rankscope:corridor_margin_bytes": "rankscope_gpu_free_min_bytes{{{selector}}} - rankscope_corridor_floor_bytes{{{selector}}}",
}


ALERTS = (
    Alert(
        "RankscopeCorridorBreach",
        "critical",
        expr="""
        increase(rankscope_corridor_breach_seconds_total{{{selector}}}[{corridorBreachWindow}]) > 0
        or
        increase(rankscope_corridor_breaches_total{{{selector}}}[{corridorBreachWindow}]) > 0
        or
        rankscope:corridor_margin_bytes < 0
        """,
        for_="corridorBreachFor",
        summary="A card's free memory fell below its corridor floor.",
        description="""Card <card> spent time below its free-memory floor{{ with printf
        "rankscope_corridor_floor_bytes{instance=%q,uuid=%q}" $labels.instance
        $labels.uuid | query }} of {{ . | first | value | humanize1024 }}B{{ end }} within
        the breach window; the next allocation there may fail with out-of-memory.""",
    ),
    Alert(
        "RankscopeCorridorThin",
        "warning",
        expr="""
        rankscope:corridor_margin_bytes >= 0
        and
        rankscope:corridor_margin_bytes < {corridorThinShare} * rankscope_corridor_floor_bytes{{{selector}}}
        """,
        for_="corridorThinFor",
        slow=True,
        summary="A card's worst-instant free memory stays close to its corridor floor.",
        description="""Card <card> has kept only {{ $value | humanize1024 }}B of free memory
        above its floor at its worst instant.""",
    ),
)
