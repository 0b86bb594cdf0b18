"""A plain transformers generation script: a LLaMA-style model built from a config with
random weights, on CUDA, generating with a static KV cache, eagerly and then with
transformers' own compiled decoding (generate() compiles the forward in "reduce-overhead"
mode, CUDA graphs, when the cache is static). It imports nothing from rankscope.

    python llama_generate.py [--layers 8] [--hidden 1024] [--new-tokens 48]
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4, help="generations per mode")
    args = parser.parse_args()

    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"parameters: {params} bytes", flush=True)
    prompt = torch.randint(0, config.vocab_size, (1, 32), device="cuda")
    settings = dict(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,
    )

    for mode in ("eager", "cuda graphs"):
        # The second mode lets generate() compile its decoding step, as transformers does
        # by default with a static cache (torch.compile "reduce-overhead": CUDA graphs).
        settings["disable_compile"] = mode == "eager"
        for _ in range(args.rounds):
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(prompt, **settings)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        print(
            f"{mode}: {args.new_tokens} tokens in {seconds:.3f} s, last token {out[0, -1].item()}",
            flush=True,
        )
    time.sleep(2.0)  # hold still a moment, as a server between requests


if __name__ == "__main__":
    main()
