"""A realistic job's events, written through the real JsonLinesEvents writer.

Three workers on two loopback hosts; 127.0.0.1[1] is killed (rollback, 7
steps lost); 127.0.0.2 gets a spot notice and leaves gracefully; 127.0.0.3
joins; a checkpoint is saved and loaded; the driver restarts and adopts
both workers; the job succeeds. Every event kind
of the schema appears at least once.
"""

from __future__ import annotations

from pathlib import Path

from cloud_elastic.events import JsonLinesEvents

JOB = "5f3a9c1e"
T0 = 1_763_900_000.0

_W = [("127.0.0.1", 0), ("127.0.0.1", 1), ("127.0.0.2", 0)]

TIMELINE: list[tuple[float, str, dict]] = [
    (0.0, "job_started", {"num_proc": 3, "min_np": 1, "max_np": 4, "provider": "static",
                          "command": ["python", "train.py"]}),
    (0.1, "hosts_changed", {"added": [{"host": "127.0.0.1", "slots": 2}, {"host": "127.0.0.2", "slots": 1}],
                            "removed": [], "draining": []}),
    *[(0.2, "worker_started", {"host": h, "slot": s, "worker": f"{h}[{s}]#1"}) for h, s in _W],
    *[(1.5 + i / 10, "worker_ready", {"host": h, "slot": s, "worker": f"{h}[{s}]#1"}) for i, (h, s) in enumerate(_W)],
    (2.0, "round_formed", {"round": 1, "size": 3, "synced": True, "step": None,
                           "ranks": {"127.0.0.1": [0, 1], "127.0.0.2": [2]},
                           "workers": ["127.0.0.1[0]#1", "127.0.0.1[1]#1", "127.0.0.2[0]#1"]}),
    (2.2, "checkpoint_loaded", {"step": 0, "path": "/ck/step-0"}),
    (9.0, "worker_failed", {"host": "127.0.0.1", "slot": 1, "worker": "127.0.0.1[1]#1", "exit_code": None,
                            "signal": "SIGKILL", "blacklisted_s": 10.0, "round": 1}),
    (9.1, "rollback", {"commit_step": 40, "steps_lost": 7, "round": 1, "reason": "127.0.0.1[1] failed"}),
    (10.0, "round_formed", {"round": 2, "size": 2, "synced": False, "step": 40,
                            "ranks": {"127.0.0.1": [0], "127.0.0.2": [1]}, "workers": ["127.0.0.1[0]#1", "127.0.0.2[0]#1"]}),
    # Round 2 looked stuck for a while (the watch asks for stacks before it acts); it then moved on.
    (11.9, "collective_stalled", {"round": 2, "seq": 57, "op": "gradient allreduce", "waited_s": 5.2, "waiting": [0],
                                  "verdict": "still heartbeating",
                                  "missing": [{"rank": 1, "worker": "127.0.0.2[0]#1", "host": "127.0.0.2", "slot": 0,
                                               "last": "#56 gradient allreduce of round 2 completed 5.3s ago",
                                               "silent_s": 0.2}]}),
    (12.0, "round_stalled", {"round": 2, "idle_s": 120.0, "reason": "no member made progress",
                             "workers": ["127.0.0.1[0]#1", "127.0.0.2[0]#1"]}),
    (12.1, "stacks", {"host": "127.0.0.2", "slot": 0, "worker": "127.0.0.2[0]#1", "rank": 1, "round": 2,
                      "text": "Current thread 0x1 (most recent call first):\n  File \"train.py\", line 9 in step\n"}),
    (13.0, "straggler", {"host": "127.0.0.1", "slot": 1, "worker": "127.0.0.1[1]#2", "rank": 1, "round": 2,
                         "compute_s": 0.42, "median_s": 0.2, "factor": 2.0, "window_s": 60.0, "blacklisted_s": 10.0}),
    (13.5, "slow_link", {"host": "127.0.0.2", "workers": ["127.0.0.2[0]#1"], "mb_s": 11.5, "peers_mb_s": 1180.0,
                         "peers": ["127.0.0.1", "127.0.0.3"], "factor": 4.0, "blacklisted_s": 10.0}),
    (14.0, "checkpoint_saved", {"step": 60, "path": "/ck/step-60", "duration_s": 0.4, "bytes": 1048576}),
    (14.5, "checkpoint_failed", {"reason": "could not write checkpoint /ck/step-70: SlowDown", "failed_in_a_row": 1,
                                 "since_s": 0.0}),
    (15.0, "notice", {"source": "aws", "host": "127.0.0.2", "deadline": T0 + 135.0, "action": "terminate"}),
    (15.5, "hosts_changed", {"added": [], "removed": [],
                             "draining": [{"host": "127.0.0.2", "reason": "spot interruption", "deadline": T0 + 135.0}]}),
    (16.0, "worker_left", {"host": "127.0.0.2", "slot": 0, "worker": "127.0.0.2[0]#1", "reason": "host draining"}),
    (16.2, "round_formed", {"round": 3, "size": 1, "synced": False, "step": 72, "ranks": {"127.0.0.1": [0]},
                            "workers": ["127.0.0.1[0]#1"]}),
    (18.0, "hosts_changed", {"added": [{"host": "127.0.0.3", "slots": 1}],
                             "removed": [{"host": "127.0.0.2", "reason": "gone from discovery"}], "draining": []}),
    (18.1, "worker_started", {"host": "127.0.0.3", "slot": 0, "worker": "127.0.0.3[0]#1"}),
    (19.5, "worker_ready", {"host": "127.0.0.3", "slot": 0, "worker": "127.0.0.3[0]#1"}),
    (20.0, "round_formed", {"round": 4, "size": 2, "synced": True, "step": 80,
                            "ranks": {"127.0.0.1": [0], "127.0.0.3": [1]}, "workers": ["127.0.0.1[0]#1", "127.0.0.3[0]#1"]}),
    # The driver restarts within --driver-grace and takes over both workers where they stand.
    (24.0, "worker_adopted", {"host": "127.0.0.1", "slot": 0, "worker": "127.0.0.1[0]#1", "round": 4, "rank": 0,
                              "commit_step": 95}),
    (24.1, "worker_adopted", {"host": "127.0.0.3", "slot": 0, "worker": "127.0.0.3[0]#1", "round": 4, "rank": 1,
                              "commit_step": 95}),
    (24.2, "adoption_done", {"round": 4, "adopted": 2, "missing": []}),
    # Several host sources with prices: the running cost, and a fallback group the job scaled up.
    (25.0, "capacity", {"source": "on-demand", "hosts": 1, "reason": "1 fallback slot(s) wanted"}),
    # --spares 1: a spare host's worker waits outside the rounds, ready to take a lost member's place.
    (25.1, "worker_started", {"host": "127.0.0.4", "slot": 0, "worker": "127.0.0.4[0]#1"}),
    (25.4, "worker_ready", {"host": "127.0.0.4", "slot": 0, "worker": "127.0.0.4[0]#1"}),
    (25.5, "spares", {"ready": 1, "wanted": 1, "workers": ["127.0.0.4[0]#1"]}),
    (26.0, "cost", {"dollars": 0.0125, "dollars_per_hour": 1.8, "slot_hours": 0.02, "per_step": 0.000125,
                    "fallback_slots": 1, "by_source": {"spot-a": 0.0125}}),
    (30.0, "job_finished", {"outcome": "succeeded", "exit_code": 0, "resets": 3, "wall_s": 30.0}),
]


def write_recorded_events(path: Path, job: str = JOB) -> Path:
    """Write :data:`TIMELINE` to ``path`` with the real writer, its clock set to each event's time."""
    now = [T0]
    with JsonLinesEvents(str(path), job, clock=lambda: now[0]) as sink:
        for dt, kind, fields in TIMELINE:
            now[0] = T0 + dt
            sink.emit(kind, **fields)
    return path
