"""kit's reference trainer: a small real model, Lightning multi-node DDP.

Run it through ``kit launch`` (``python -m kit.train --max-steps 100``). It
takes its topology from the launcher's variables (``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``), so ``devices`` always equals the tasks per node; gloo
on CPU, NCCL on GPU. Checkpoints go to ``$KIT_JOB_DIR/checkpoints`` (or
``--checkpoint-dir``); a run resumes from ``last.ckpt`` when it exists.

Preemption: on the warning signal (``$KIT_WARNING_SIGNAL``, USR1 by
default) every rank agrees at the next step to save ``last.ckpt`` and stop;
the batch script then requeues the job. When ``--max-steps`` is reached the
trainer writes ``$KIT_FINISHED_FILE`` so the job is never requeued again.

This module imports torch and Lightning; nothing on the ``kit launch`` path
imports it.
"""
