"""Held-out text unlike the calibration sentences, by kind, for the INT8 accuracy gate.

Quantization error concentrates on text whose activations differ from the calibration set's
(onnxruntime#9599: INT8 MiniLM silently loses accuracy): one token repeated hundreds of times,
punctuation runs, blank text, other scripts, emoji, code, URLs, numbers, markup. The gate checks
each kind on its own (:func:`heldout_texts`), so a good mean on prose cannot hide a bad kind.

Every text is generated here or taken from the standard library (Python source through
``inspect``, HTML from ``pydoc.HTMLDoc``, documentation topics from ``pydoc_data``), so the set is
the same on every machine without a download. The multilingual sentences are written out below.
None of it is calibration text: calibration draws on :func:`calibration_extras` (other tokens,
other lengths) and the pydoc calibration split.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random

# token, repeat counts: the counts straddle the 128- and 256-token buckets and truncation
REPEATED_TOKENS = ("x", "a", "?", "the", "!", ".", "ok", "1", "-", "hello", "z", "de", "?!")
REPEAT_COUNTS = (1, 5, 20, 60, 127, 200, 254, 600)
PUNCTUATION_RUNS = ("!" * 200, "." * 500, "?!" * 100, "-" * 300, "ab" * 300, "*" * 64, "=" * 120, "#" * 40)
BLANK = ("", " ", "   ", "\n", "\n\n\n", "\t", " \t\n ", "\u00a0", "\u3000", " " * 200)
MULTILINGUAL = {
    "fr": ("Le serveur répond en moins d'une milliseconde.", "Où se trouve la gare la plus proche ?",
           "Les modèles quantifiés doivent rester précis."),
    "de": ("Der Server antwortet in weniger als einer Millisekunde.", "Wo ist der nächste Bahnhof?",
           "Quantisierte Modelle müssen genau bleiben."),
    "es": ("El servidor responde en menos de un milisegundo.", "¿Dónde está la estación más cercana?",
           "Los modelos cuantizados deben seguir siendo precisos."),
    "zh": ("服务器在不到一毫秒内响应。", "最近的火车站在哪里？", "量化模型必须保持准确。"),
    "ja": ("サーバーは一ミリ秒以内に応答します。", "一番近い駅はどこですか？", "量子化されたモデルは正確でなければならない。"),
    "ko": ("서버는 1밀리초 안에 응답합니다.", "가장 가까운 기차역이 어디에 있나요?", "양자화된 모델은 정확해야 합니다."),
    "ru": ("Сервер отвечает менее чем за миллисекунду.", "Где находится ближайший вокзал?",
           "Квантованные модели должны оставаться точными."),
    "ar": ("يستجيب الخادم في أقل من جزء من الثانية.", "أين أقرب محطة قطار؟", "يجب أن تبقى النماذج المكممة دقيقة."),
    "hi": ("सर्वर एक मिलीसेकंड से कम में जवाब देता है।", "सबसे नज़दीकी रेलवे स्टेशन कहाँ है?", "क्वांटाइज़ किए गए मॉडल सटीक रहने चाहिए।"),
    "el": ("Ο διακομιστής απαντά σε λιγότερο από ένα χιλιοστό του δευτερολέπτου.", "Πού είναι ο πλησιέστερος σταθμός;"),
    "he": ("השרת עונה בפחות ממילישנייה.", "איפה תחנת הרכבת הקרובה?"),
    "th": ("เซิร์ฟเวอร์ตอบสนองภายในเวลาไม่ถึงหนึ่งมิลลิวินาที", "สถานีรถไฟที่ใกล้ที่สุดอยู่ที่ไหน"),
}
EMOJI = ("😃", "🥱🥱🥱", "🚀 🚀 🚀 🚀", "👍🏽👍🏽", "🇫🇷🇩🇪🇯🇵", "❤️‍🔥", "😀" * 50, "great job 🎉🎉", "🤖 serves 📦 models ⚡",
         "👨‍👩‍👧‍👦 family", "☕️ + 🍰 = 😋")


def _chunks(text: str, size: int, count: int) -> list[str]:
    return [text[i:i + size] for i in range(0, min(len(text), size * count), size) if text[i:i + size].strip()]


def _code() -> list[str]:
    import heapq
    import json.encoder
    import textwrap

    source = "\n".join(inspect.getsource(module) for module in (textwrap, heapq, json.encoder))
    return _chunks(source, 400, 24)


def _markup() -> list[str]:
    import pydoc
    import textwrap
    from pydoc_data.topics import topics

    html = pydoc.HTMLDoc().docmodule(textwrap)
    documents = [json.dumps({"topic": name, "length": len(text), "first": text[:80], "tags": sorted(set(text.split()[:6]))})
                 for name, text in sorted(topics.items())[:12]]
    return _chunks(html, 400, 12) + documents


def _urls() -> list[str]:
    import sys

    names = sorted(sys.stdlib_module_names)[::23]
    return ([f"https://docs.python.org/3/library/{name}.html#module-{name}" for name in names[:12]]
            + [f"see https://example.com/search?q={name}&page={i}&lang=en for {name}" for i, name in enumerate(names[12:18])]
            + ["ftp://files.example.org/pub/releases/v2.51.0/tritonserver-2.51.0.tar.gz", "mailto:ops@example.com"])


def _numbers() -> list[str]:
    rng = random.Random(20261201)
    return ([" ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(n)) for n in (1, 8, 40, 120)]
            + ["3.14159 2.71828 1.41421 1.73205", "+1 (555) 010-2345", "2026-12-01T21:17:09Z", "1,234,567.89 EUR",
               "0x7fffffff 0b1010 0o755", "-273.15 °C", "v2.51.0-rc3", "192.168.000.001:8000"]
            + ["".join(rng.choice("0123456789") for _ in range(n)) for n in (16, 64, 300)])


def heldout_texts() -> dict[str, list[str]]:
    """Held-out texts by kind: ``repeated``, ``punctuation``, ``blank``, ``multilingual``, ``emoji``,
    ``code``, ``urls``, ``numbers``, ``markup`` (HTML and JSON). Deterministic for a Python release."""
    return {
        "repeated": [(token + " ") * count for token in REPEATED_TOKENS for count in REPEAT_COUNTS],
        "punctuation": list(PUNCTUATION_RUNS),
        "blank": list(BLANK),
        "multilingual": [text for texts in MULTILINGUAL.values() for text in texts],
        "emoji": list(EMOJI),
        "code": _code(),
        "urls": _urls(),
        "numbers": _numbers(),
        "markup": _markup(),
    }


def split_heldout(kinds: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(validation, evaluation): each kind's texts split by sha256, half each, disjoint.

    Validation chooses the quantization recipe; evaluation is the gate proper, so the gate is
    never judged on the texts that picked the recipe. A kind with a single text goes to evaluation.
    """
    validation: dict[str, list[str]] = {}
    evaluation: dict[str, list[str]] = {}
    for kind, texts in kinds.items():
        for text in texts:
            side = validation if hashlib.sha256(text.encode("utf-8")).digest()[0] % 2 else evaluation
            side.setdefault(kind, []).append(text)
        evaluation.setdefault(kind, [])
        if not evaluation[kind]:  # every kind is gated
            evaluation[kind].append(validation[kind].pop())
    return validation, evaluation


def calibration_extras() -> list[str]:
    """Degenerate calibration text: other tokens and lengths than :func:`heldout_texts`, so the
    calibration ranges cover such activations without the gate seeing its own calibration data."""
    tokens = ("w", "b", "#", "and", "0", "...", "yes")
    return [(token + " ") * count for token in tokens for count in (3, 30, 100, 250)] + ["  ", "\n\t", "~" * 80]
