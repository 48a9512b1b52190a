"""A real pretrained model: SmolLM2-135M's tied embedding read from its GGUF file (`gguf_tables`), converted to
PIT's form in a conversion mode (`conversion`) with its certificate (`certificate`), a scaled mode's logit
scale as a 1-D minimisation (`scale`), the reference PIT module built from it (`pit_module`, `factory`) and
the model's own 30 transformer blocks under a tied, untied or PIT head (`body`). Continued pretraining and the
study of the modes are the convert verb's (pitcheck.verbs.convert).

Nothing heavy is imported here: gguf, torch and transformers load when a function needs them.
"""
