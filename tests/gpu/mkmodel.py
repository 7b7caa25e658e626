# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a tiny random-init Qwen3 target, a byte-level BPE tokenizer and a random-init DFlash drafter,
entirely offline. Usage: python3 mkmodel.py OUTROOT (default /root/models)

    OUTROOT/tiny-qwen3/          target: Qwen3ForCausalLM, hidden 256, 4 layers, vocab 2048, bf16, seed 0
    OUTROOT/tiny-qwen3-dflash/   drafter: DFlashDraftModel, 1 layer, block_size 8,
                                 dflash_config {target_layer_ids: [0, 1, 2], mask_token_id}
    OUTROOT/model_info.json

The rig script of the first H200 run (shared/gpu/mkmodel.py, 2026-11-29), reformatted: same seeds and
construction order, so the same models. Needs torch, transformers, tokenizers and safetensors. The models
are random: only vLLM's plumbing and the spec-decode counters mean anything.
"""

import json
import os
import random
import sys
import time

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

t0 = time.time()
root = sys.argv[1] if len(sys.argv) > 1 else "/root/models"
tgt, dfl = os.path.join(root, "tiny-qwen3"), os.path.join(root, "tiny-qwen3-dflash")
os.makedirs(tgt, exist_ok=True)
os.makedirs(dfl, exist_ok=True)
torch.manual_seed(0)
random.seed(0)

# ---- tokenizer: byte-level BPE trained on generated text ----
WORDS = (
    "the a of to and in is it that for on with as was be by this are or from at an have not but they which one "
    "you were all we can her has there been if more when will would who so no out up into do time only two may "
    "other could new some these model token speculative decoding draft target accept reject server request "
    "latency python vllm cache block layer attention head batch sample greedy prompt repeat"
)
words = WORDS.split()
lines = []
for _i in range(20000):
    n = random.randint(4, 16)
    lines.append(
        " ".join(random.choice(words) for _word in range(n))
        + random.choice([".", ",", "!", "?", ""])
        + f" {random.randint(0, 999)}"
    )
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
trainer = trainers.BpeTrainer(
    vocab_size=2000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
)
tok.train_from_iterator(lines, trainer)
ntok = tok.get_vocab_size()
eos_id, mask_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|mask|>")
hf_tok = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|endoftext|>",
    pad_token="<|endoftext|>",
    bos_token=None,
    additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|mask|>"],
)
hf_tok.chat_template = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
for d in (tgt, dfl):
    hf_tok.save_pretrained(d)

# ---- target: tiny Qwen3 ----
VOCAB = 2048
assert ntok <= VOCAB, ntok
cfg = Qwen3Config(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    eos_token_id=eos_id,
    bos_token_id=eos_id,
    pad_token_id=eos_id,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    torch_dtype="bfloat16",
)
cfg.architectures = ["Qwen3ForCausalLM"]
model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(tgt, safe_serialization=True)
nparams = sum(p.numel() for p in model.parameters())

# ---- DFlash drafter: 1 Qwen3 decoder layer + fc over 3 target layers; shares embed/lm_head ----
target_layer_ids = [0, 1, 2]
dcfg = Qwen3Config(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    eos_token_id=eos_id,
    rms_norm_eps=1e-6,
    torch_dtype="bfloat16",
)
dmodel = Qwen3ForCausalLM(dcfg).to(torch.bfloat16)
sd = {}
for k, v in dmodel.state_dict().items():
    if k.startswith("model.layers."):
        sd[k[len("model.") :]] = v.contiguous()
H = 256
sd["fc.weight"] = (torch.randn(H, H * len(target_layer_ids)) * 0.02).to(torch.bfloat16)
sd["hidden_norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
sd["norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
save_file(sd, os.path.join(dfl, "model.safetensors"), metadata={"format": "pt"})
dj = dcfg.to_dict()
dj.update(
    {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 8,
        "num_target_layers": cfg.num_hidden_layers,
        "target_hidden_size": H,
        "dflash_config": {"target_layer_ids": target_layer_ids, "mask_token_id": mask_id},
    }
)
dj.pop("transformers_version", None)
with open(os.path.join(dfl, "config.json"), "w") as f:
    json.dump(dj, f, indent=2)
info = {
    "tokenizer_vocab": ntok,
    "eos_id": eos_id,
    "mask_id": mask_id,
    "target_params": nparams,
    "draft_tensors": {k: list(v.shape) for k, v in sd.items()},
    "seconds": round(time.time() - t0, 2),
}
with open(os.path.join(root, "model_info.json"), "w") as f:
    json.dump(info, f, indent=2)
print(json.dumps(info)[:600])
