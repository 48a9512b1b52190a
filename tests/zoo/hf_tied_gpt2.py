"""Not PIT: a tiny Hugging Face GPT-2 built from a config (no download) with standard weight tying,
W = E^T. The validator accepts it through get_input_embeddings/get_output_embeddings and must find that
W E is not the identity (penrose). Needs the optional `transformers` package."""
import torch


def make(vocab_size, hidden_size, *, dtype, device, seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=1, n_head=1, n_positions=8,
                        tie_word_embeddings=True)
    return GPT2LMHeadModel(config).to(device=device, dtype=dtype)
