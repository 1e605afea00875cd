"""On-device sampling: the sampler, penalties, logprobs."""
