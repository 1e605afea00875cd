"""`jaxinfer serve`'s flags for sleep mode and weight updates (routes in weight_routes)."""

from __future__ import annotations

import argparse


def add_weight_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--enable-sleep-mode", action="store_true",
                       help="as vLLM's: serve POST /sleep?level=1|2 (free the KV pool and the weights' device memory; "
                       "level 1 keeps the weights in host memory), POST /wake_up and GET /is_sleeping")
    serve.add_argument("--enable-weight-updates", action="store_true",
                       help="serve SGLang's POST /update_weights_from_disk {\"model_path\": DIR}: the weights of a "
                       "checkpoint of the served architecture and shapes, nothing recompiled (an RL loop's new policy)")


def check_weight_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flags that do not go together."""
    asked = [flag for flag, on in (("--enable-sleep-mode", args.enable_sleep_mode),
                                   ("--enable-weight-updates", args.enable_weight_updates)) if on]
    if not asked:
        return
    if args.shadow_fraction > 0:  # speculation goes: its fallback is in the engine, an EAGLE head follows
        raise ValueError(f"{' and '.join(asked)} do not go with --shadow-fraction yet: shadow validation's "
                         "reference would keep the old weights and judge the new ones by them")
