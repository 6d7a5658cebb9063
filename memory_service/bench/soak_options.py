"""The options of `memory-service bench soak`: light, since every `memory-service` command builds them."""

from __future__ import annotations

import argparse

FAULT_KINDS = "service_kill,llama_kill,model_stall,disk_full"


def add_soak_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    soak = parser.add_argument_group("soak (memory-service bench soak)")
    soak.add_argument("--minutes", type=float, default=10.0, help="soak: length of the load, baseline included")
    soak.add_argument(
        "--bound", type=float, default=5.0, help="soak: faulted recall/ack p99 may be at most this times the quiet one"
    )
    soak.add_argument(
        "--baseline-fraction", type=float, default=0.1, help="soak: share of the run measured quiet, first"
    )
    soak.add_argument("--baseline-min-s", type=float, default=30.0, help="soak: the quiet baseline lasts at least this")
    soak.add_argument("--agents-per-team", type=int, default=2, help="soak: agents in each of the two teams")
    soak.add_argument("--rate", type=float, default=1.0, help="soak: operations a second per agent")
    soak.add_argument("--faults", default=FAULT_KINDS, help=f"soak: comma-separated fault kinds ({FAULT_KINDS})")
    soak.add_argument("--fault-every-s", type=float, default=60.0, help="soak: about one fault this often")
    soak.add_argument("--model", default="default", help="soak: the model llama-server runs")
    return parser
