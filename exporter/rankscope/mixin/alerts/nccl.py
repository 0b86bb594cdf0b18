"""NCCL's own view through its RAS endpoints: communicators stuck at different counts, dead
peers."""

from rankscope.mixin.alerts import Alert

ALERTS = (
    Alert(
        "RankscopeNcclCountMismatch",
        "critical",
        expr="""
        max by ({daemonLabels}, endpoint, comm, comm_secondary, boot, op) (rankscope_nccl_count_mismatch{{{selector}}}) == 1
        or
        max by ({daemonLabels}, endpoint, comm, comm_secondary, boot) (rankscope_nccl_status_mismatch{{{selector}}}) == 1
        """,
        for_="ncclCountMismatchFor",
        summary="NCCL's RAS shows ranks of one communicator stuck at different counts.",
        description="""{{ if $labels.op }}The ranks of NCCL communicator {{ $labels.comm }}
        disagree on their {{ $labels.op }} count, and the lagging ranks have not moved
        over several polls{{ else }}The ranks of NCCL communicator {{ $labels.comm }}
        report different status (init, error, finalize or abort){{ end }}, as the RAS
        endpoint {{ $labels.endpoint }} on {{ $labels.instance }} reports it{{ if
        $labels.boot }} (boot {{ $labels.boot }}){{ end }}. The communicator is hung or
        about to hang in a mismatched collective.""",
    ),
    Alert(
        "RankscopeNcclPeerDead",
        "critical",
        expr="rankscope_nccl_dead_processes{{{selector}}} > 0",
        for_="ncclPeerDeadFor",
        summary="NCCL's RAS considers a process of the job dead.",
        description="""The RAS endpoint {{ $labels.endpoint }} on {{ $labels.instance }}
        reports {{ $value }} job process(es) unreachable over the RAS network for 60 s or
        more (considered dead); every communicator they belong to will hang.""",
    ),
)
