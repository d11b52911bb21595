"""Making model folders: generated (make_model, make_hf_model), built from a PyPI wheel
(make_real_model), exported with onnxruntime-genai's builder (export_model) or downloaded
(download_model). README.md says which file does what."""
