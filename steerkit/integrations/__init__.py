"""Steering inside other inference engines, which schedule the batch and sample themselves.

- :mod:`steerkit.integrations.requests`: a request's steering arguments (``rewards``, ``k``) parsed and
  validated by :mod:`steerkit.params`, its rewards loaded once per process (:func:`~steerkit.rewards.loading.load_reward`).
- :mod:`steerkit.integrations.batch`: :class:`~steerkit.integrations.batch.HostedBatch`, the rows of a batch
  that another engine owns (rows by batch index, added, removed and moved), their reward sessions
  (:mod:`steerkit.engine.reward_groups`) fed every token the engine committed, and the RAD step
  (:mod:`steerkit.engine.step`) on the steered rows' logits.
- :mod:`steerkit.integrations.vllm`: vLLM's v1 logits-processor interface over ``HostedBatch`` (needs vLLM,
  docs/vllm.md).

Nothing here is imported by ``import steerkit``.
"""
