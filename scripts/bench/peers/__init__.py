"""The peers `python -m scripts.bench peers` compares the sidecar with: llama.cpp's own server.

    gguf_model  converts a generated onnxruntime-genai model folder into a GGUF file that
                llama.cpp loads as Phi-3: the same int4 weights as Q4_0 blocks, the same
                vocabulary as a gpt2-type BPE, the same chat template
    llamacpp    starts llama-server (built by scripts/bench/peers/build_llamacpp.sh) and drives one
                generation through its /completion API, timed like our variants

Installed only on request: `make peers` (requirements-peers.txt, requirements-peers-src.txt).
"""
