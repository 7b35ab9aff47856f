"""Tasks and rewards, generation engines, the built-in tiny policy, RL losses and training.

The code is organized as follows:

- `tasks.py`: tasks and rewards, a deterministic adapter over `reasoning-gym`.
- `samples.py`: training samples: an opened rollout re-scored from its task, or refused.
- `judge.py`: the audit's task judge: a rollout's assignment re-derived and re-scored.
- `engine.py`: the generation engine interface and sampling settings.
- `engine_hf.py`: the CPU engine on transformers.
- `engine_vllm.py`: the engine on vLLM (its CPU build or a CUDA GPU).
- `engines.py`: opening an engine on a model directory.
- `model_dir.py`: loading and saving a Hugging Face causal-LM directory.
- `tiny_policy.py`: the built-in tiny policy: tokenizer, model, warm start.
- `shaped_model.py`: a model directory of a real Qwen2 shape with random weights.
- `produce.py`: producing signed rollout records.
- `groups.py`: groups of samples made in-process, and held-out evaluation.
- `loss.py`: the RL loss: group-relative advantages and the clipped surrogate.
- `train_loop.py`: the training loop: re-scored groups in, policy versions out.
- `micro_step.py`: one step's gradients in micro-batches, log-probs at completion positions only.
- `distributed.py`: the trainer's ranks on torch.distributed (DDP): channels, launch.
- `follower.py`: a rank other than 0, taking part in the steps rank 0 sends.
- `devices.py`: where a model computes (`--device`) and at which precision.
- `local_train.py`: local training on a peer's own copy (SAPO style).
- `single.py`: plain on-policy GRPO in one process, the reference learner.
- `checkpoint.py`: canonical safetensors checkpoints (one layout, one digest).
- `delta.py`: exact delta patches between two canonical checkpoints.
- `export.py`: a policy version as shards and weight manifests.

Its modules are imported by name (`trainer.tasks`, ...): most of them import torch, which
`import trainer` alone does not.
"""
