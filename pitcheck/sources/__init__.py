"""Gradient sources with state of their own: the protocol a run knows them by (stateful), the real-text
language model (lm/) and a real pretrained model (pretrained/).

Nothing is imported here: `import pitcheck` stays free of numpy and torch.
"""
