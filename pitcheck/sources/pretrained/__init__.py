"""A real pretrained model: SmolLM2-135M's tied embedding read from its GGUF file, converted to the exact PIT
form (`conversion`), the reference PIT module built from it (`factory`) and continued pretraining with the
model's own 30 transformer blocks (`body`, `continued`).

Nothing heavy is imported here: gguf, torch and transformers load when a function needs them.
"""
