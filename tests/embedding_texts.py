"""A few hundred varied texts for the embedding parity tests: short queries, passages, empty-ish
(whitespace, punctuation), non-Latin scripts, emoji, mixed case and long texts up to and past the
model's 256-token limit (those past it are embedded with truncation)."""

from __future__ import annotations

import random

_WORDS = ("retrieval augmented generation vector store cosine similarity index query passage document "
          "transformer attention encoder pooling normalization batch token latency throughput kernel "
          "the a of and to in is was for on with as by at from that this which").split()
_SCRIPTS = ["Привет, как дела? Это тест.", "日本語の文章を埋め込みます。", "中文句子：向量检索很有用。",
            "مرحبا بالعالم، هذا اختبار", "שלום עולם", "नमस्ते दुनिया, यह एक परीक्षण है", "Ελληνικά κείμενα εδώ",
            "한국어 문장입니다", "ภาษาไทยเป็นภาษาที่สวยงาม", "Ça va très bien, merci — naïve café"]
_EMOJI = ["🎉", "🚀🚀🚀", "I ❤️ embeddings 😀", "👩‍👩‍👧‍👦 family", "🇫🇷🇯🇵", "⚡️ fast ⚡️", "🤖: beep boop"]
_EMPTYISH = [" ", "   ", "\n", "\t \n", ".", "?", "!!!", "-", "a", "I", "0", "…", "\u200b", "''"]


def varied_texts(count: int = 300, seed: int = 43) -> list[str]:
    rng = random.Random(seed)
    texts = list(_EMPTYISH) + list(_SCRIPTS) + list(_EMOJI)
    while len(texts) < count:
        kind = rng.random()
        if kind < 0.45:
            n = rng.randint(2, 12)
        elif kind < 0.85:
            n = rng.randint(30, 180)
        else:
            n = rng.randint(230, 400)  # near and past the limit
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), rng.choice(_SCRIPTS + _EMOJI))
        text = " ".join(words)
        texts.append(text.capitalize() if rng.random() < 0.5 else text.upper() if rng.random() < 0.1 else text)
    return texts[:count]
