"""Long trajectories of a PIT model under adversarial gradients, written to a run directory.

A run directory (infra/rundir.py) holds manifest.json (config, versions, policy), metrics.csv (one row per
recorded step: log-spaced plus the last), events.jsonl (skipped steps, breakdowns, threshold crossings)
and checkpoint.npz (the state at the last commit). Every recorded step is one commit of all four files,
so a run killed at any instant leaves a consistent directory that `resume=True` continues with
identical results; SIGINT and SIGTERM let the step in progress finish and commit it first. Resuming
checks everything it loads against this run's config and state, and refuses with the reason.
A torch run also steps a float64 shadow on the same gradient stream (numpy on the CPU, torch float64 on the
model's GPU: trajectory.step.shadow_engine_placement) and reports its distance.

The parts, one concept each: config (RunConfig and its refusals), teacher (reading a teacher embedding),
memory (refusing a V x D that cannot fit), step (the model and its shadow in lockstep), checkpoint (the
manifest, the commit, resuming), loop (Trajectory: the loop, its signals and progress; `run`).
"""
from .checkpoint import input_hashes, versions
from .config import (GPU_MIN_ELEMENTS, MAX_COND, MAX_STEPS, RunConfig, check_device,
                     check_device_present, default_backend, recorded_steps, run_device)
from .loop import RunBreakdown, RunInterrupted, Trajectory, run, skipped_steps
from .memory import available_memory, check_memory
from .step import Lockstep, initial_state, make_engine
from .teacher import load_teacher, teacher_header, teacher_shape, teacher_source

__all__ = ["GPU_MIN_ELEMENTS", "MAX_COND", "MAX_STEPS", "Lockstep", "RunBreakdown", "RunConfig", "RunInterrupted",
           "Trajectory", "available_memory", "check_device", "check_device_present", "check_memory",
           "default_backend", "initial_state", "input_hashes", "load_teacher", "make_engine", "recorded_steps", "run",
           "run_device", "skipped_steps", "teacher_header", "teacher_shape", "teacher_source", "versions"]
