#!/usr/bin/env python3
"""Writes tests/tokenizer/corpus.json: the strings kiln's tokenizer conformance tests encode.

Hand-written cases per category (prose, code, scripts, emoji, whitespace, numbers, contractions,
special-token text, unusual Unicode, long words), then seeded random mixtures of them. The
output is committed; rerun this script (standard library only) after editing the cases, then
regenerate the references (tools/tokenizer/make_references.sh).

Usage: tools/tokenizer/make_corpus.py [--out tests/tokenizer/corpus.json]
"""
import argparse
import json
import random
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ENGLISH = [
    "Hello world",
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom...",
    "\u201cSmart quotes\u201d and \u2018single ones\u2019 \u2014 with an em dash \u2013 and an en dash.",
    "Wait\u2026 what? No! Yes?! (Maybe.) [Certainly] {Perhaps}",
    "Email me at someone@example.com or visit https://example.com/path?query=1&b=2#frag.",
    "#hashtag @mention $100 50% 3/4 a+b=c x*y^2 ~tilde `backtick` |pipe| \\backslash",
    "Mr. Smith went to Washington, D.C., on Jan. 5th, 2021 at 10:30 a.m.",
    "THIS IS SHOUTING. this is whispering. ThIs Is MoCkInG.",
    "e.g. i.e. etc. vs. cf. U.S.A. Ph.D.",
    "A sentence with trailing spaces.   ",
    "   A sentence with leading spaces.",
    "Markdown: **bold**, _italic_, `code`, [link](http://x.y), > quote\n- item 1\n- item 2\n\n1. first\n2. second",
    "| col a | col b |\n|-------|-------|\n| 1     | 2     |",
    "Once upon a time, in a land far, far away, there lived a tokenizer who loved merging pairs of bytes.",
    "Dear Sir or Madam,\n\nI am writing to inquire about the position.\n\nSincerely,\nA. Person",
    "She said, \"I'll be there at 5 o'clock,\" and left.",
    "Don't panic -- it's only a test; nothing's broken.",
    "naïve café résumé coöperate façade jalapeño piñata über straße",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo:\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self.x = x\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(f\"{x.shape=}\")\n",
    "#include <vector>\n\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }  // comment\n",
    "{\n  \"name\": \"kiln\",\n  \"version\": \"0.1.0\",\n  \"tags\": [\"a\", \"b\"],\n  \"nested\": {\"k\": null, \"n\": 1.5e-3}\n}",
    '{"a":1,"b":[true,false,null],"c":"\\u00e9\\n"}',
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "$ ls -la | grep '\\.cpp$' && echo \"done\" > /dev/null 2>&1",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "const f = async (x) => { await g(x?.y ?? 0); return `${x}!`; };",
    "<html>\n<body>\n<h1>Title</h1>\n<p>Para <b>bold</b> <i>it</i></p>\n<table><tr><td>1</td><td>2</td></tr></table>\n</body>\n</html>",
    "<div class=\"x\"><a href=\"#\">link</a><span>s</span><img src=\"a.png\"/></div>",
    "key: value\nlist:\n  - one\n  - two\nnested:\n    deep: true\n",
    "if (x) {\n\t\tif (y) {\n\t\t\t\treturn;\n\t\t}\n}",
    "\t\tindented with tabs\n\t\t\tand more tabs\n",
    "regex = r'^(?:[a-z0-9!#$%&\\'*+/=?^_`{|}~-]+)@\\w+\\.\\w{2,}$'",
    "for i in range(10):\n\tprint(i)  # mixed\n        pass\n",
    "x=1;y=2;z=x+y;print(z)//comment/*block*/",
    "    \n    \n        \n",
]

CJK = [
    "你好，世界！",
    "我们今天去公园散步，天气非常好。",
    "人工智能正在改变世界。机器学习、深度学习和自然语言处理是其中的关键技术。",
    "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。",
    "東京は日本の首都です。",
    "한국어 텍스트입니다. 안녕하세요!",
    "大韓民国의 수도는 서울입니다.",
    "ＡＢＣ１２３　全角文字とスペース",
    "「引用」『二重引用』【括弧】〈山括弧〉《書名》",
    "中文English混合mixed文本text",
    "繁體中文與簡體中文：學習／学习",
    "ｶﾀｶﾅ half-width katakana ﾊﾝｶｸ",
]

RTL = [
    "مرحبا بالعالم",
    "اللغة العربية جميلة جداً.",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
    "שלום עולם",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
    "Hebrew עברית mixed with English and numbers 123.",
    "فارسی: سلام دنیا",
    "\u200fRTL mark\u200e LTR mark \u202eoverride\u202c",
    "العدد ١٢٣٤٥ بالأرقام العربية",
]

INDIC = [
    "नमस्ते दुनिया",
    "हिन्दी भाषा में कुछ पाठ। क्षत्रिय, ज्ञान, श्री।",
    "संस्कृतम् अद्भुतम्",
    "বাংলা ভাষা",
    "தமிழ் மொழி",
    "తెలుగు భాష",
    "ગુજરાતી",
    "ਪੰਜਾਬੀ",
    "क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़",
    "कि की कु कू के कै को कौ कं कः कँ",
]

SOUTHEAST_ASIAN = [
    "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "ผู้ใหญ่ที่น่ารัก",
    "ພາສາລາວ",
    "ភាសាខ្មែរ",
    "မြန်မာဘာသာ",
    "Tiếng Việt có nhiều dấu: ă â đ ê ô ơ ư, ả ã ạ.",
]

EMOJI = [
    "🤗",
    "I love pizza 🍕🍕🍕!",
    "👨\u200d👩\u200d👧\u200d👦 family",
    "👩🏽\u200d💻 technologist",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "🇯🇵🇺🇸🇫🇷🇩🇪 flags",
    "🏳️\u200d🌈 🏴\u200d☠️",
    "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f Scotland",
    "1️⃣ 2️⃣ #️⃣ keycaps",
    "❤️ ❤ ♥️ ☺️ ✔️",
    "😀😃😄😁😆😅😂🤣",
    "emoji🎉inside🎉words",
    "🧑\u200d🤝\u200d🧑",
    "😶\u200d🌫️",
]

WHITESPACE = [
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    "a b",
    "a  b",
    "a   b",
    "a    b",
    "a\tb",
    "a\t\tb",
    "a\nb",
    "a\n\nb",
    "a\r\nb",
    "a\r\n\r\nb",
    "a \n b",
    "a\n \nb",
    " \t \n \t ",
    "line1\nline2\r\nline3\rline4",
    "trailing newline\n",
    "\nleading newline",
    "word\u00a0word",
    "word\u3000word",
    "word\u2009thin\u2002en\u2003em",
    "\u000b vertical tab \u000c form feed",
    "text\u0085next line",
    "text\u2028line\u2029para",
    "   \n\n   \n",
    "\t \t \t",
    "\n\t\n\t\n",
    "x \r\n y",
]
for n in (5, 8, 16, 17, 31, 32, 33, 40, 64):
    WHITESPACE.append("a" + " " * n + "b")
for n in (3, 7, 20, 30, 31, 32, 45):
    WHITESPACE.append("a" + "\n" * n + "b")
for n in (4, 9, 31, 33):
    WHITESPACE.append("x" + "\t" * n + "y")
WHITESPACE.append(" " * 100)
WHITESPACE.append("\n" * 100)
WHITESPACE.append(" \n" * 30)

NUMBERS = [
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159265358979323846",
    "1,000,000",
    "1.000.000,00",
    "-273.15",
    "+1 (555) 123-4567",
    "2024-01-15T10:30:00Z",
    "0xDEADBEEF 0b1010 0o755",
    "1e-10 6.022e23 1E+5",
    "abc123def456",
    "v1.2.3-beta.4",
    "Call 911 or 112",
    "٠١٢٣٤٥٦٧٨٩",
    "１２３４５",
    "x² + y³ = z¹",
    "½ ¼ ¾ ⅓",
    "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ",
    "①②③",
    "१२३४",
    "$1,234.56 €99 £5 ¥1000",
    "IPv4 192.168.0.1 IPv6 ::1",
    "3 + 4 = 7; 10/2 = 5; 2^10 = 1024",
]

CONTRACTIONS = [
    "I'm here",
    "you're right",
    "they've gone",
    "we'll see",
    "he'd know",
    "it's fine",
    "don't",
    "DON'T",
    "I'M",
    "YOU'RE",
    "THEY'VE",
    "WE'LL",
    "HE'D",
    "IT'S",
    "it'S",
    "It'Ll",
    "she'Ve",
    "'s",
    "'S",
    "'LL",
    "'ll",
    "'re'RE're",
    "rock'n'roll",
    "''quoted''",
    "O'Reilly's",
    "the cats' toys",
    "it\u2019s curly",
    "'t'm'd",
    "y'all'd've",
]

SPECIAL = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|><|im_start|><|im_end|>",
    " <|im_start|> spaced <|im_end|> ",
    "abc<|im_end|>def",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<tool_response>ok</tool_response>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<bos>",
    "<bos>Hello<eos>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>",
    "<pad><unk><mask>",
    "[multimodal]",
    "<start_of_image><image_soft_token><end_of_image>",
    "x<bos>y<eos>z",
    "<table><tr><th>h</th></tr><tr><td>d</td></tr></table>",
    "<h1>Heading</h1><h2>Sub</h2>",
    "<strong>s</strong><em>e</em><code>c</code><sub>1</sub><sup>2</sup>",
    "<ul><li>one</li><li>two</li></ul>",
    "<s>strike</s> <u>under</u>",
    "<unused0><unused1><unused99>",
    "▁▁▁ literal metaspace chars ▁",
    "<|im_start|>user\n<bos>mixed families<end_of_turn><|im_end|>",
]

PARTIAL_SPECIAL = [
    "<|im_start",
    "|im_start|>",
    "<|im_sta rt|>",
    "<|im_start |>",
    "< |im_start|>",
    "<<|im_end|>>",
    "<|endoftext|",
    "<|endoftext",
    "endoftext|>",
    "<bo",
    "<bos",
    "bos>",
    "< bos>",
    "<BOS>",
    "<start_of_tur",
    "<start_of_turn",
    "start_of_turn>",
    "<end_of_turn >",
    "<think",
    "</think",
    "<|",
    "|>",
    "<>",
    "<",
    ">",
    "<tab",
    "<table",
    "</ta",
    "<unused",
    "<unused1234567>",
]

UNICODE = [
    "zero\u200bwidth\u200bspace",
    "zwj\u200dzwnj\u200c",
    "\ufeffBOM at start",
    "soft\u00adhyphen",
    "e\u0301 (NFD e-acute)",
    "caf\u0065\u0301 vs caf\u00e9",
    "A\u030a \u212b \u00c5",
    "a\u0300\u0301\u0302\u0303\u0304 stacked marks",
    "\u1100\u1161\u11a8 hangul jamo",
    "\u0041\u0308\u0304",
    "ﬁ ﬂ ﬀ ligatures",
    "𝐀𝐁𝐂 𝕏𝕐ℤ 𝓐𝓑",
    "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
    "\ufffd replacement char",
    "\ue000 private use \U000f0000",
    "\x00 nul \x01 soh \x1b esc \x7f del",
    "\u0080\u0085\u009f C1 controls",
    "\u180e mongolian vowel separator",
    "\u2060 word joiner \u2061 function application",
    "Ωmega ohm\u2126 kelvin\u212a",
    "𐌰𐌱𐌲 gothic",
    "𠀀𠀁𠀂 CJK extension B",
    "𝄞 musical symbol",
    "Ǆ ǅ ǆ titlecase digraphs",
    "ẞ ß ſ ı İ",
    "Ꭰ Cherokee",
    "ⓐⓑⓒ circled",
    "I\u0307 dotted",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u0651",
    "ŉ ǰ ΐ",
    "\u00a0\u00a0 two nbsp",
    "\u2002\u2003\u2004 spaces",
]
UNICODE.append(unicodedata.normalize("NFD", "Ça ressemble à une phrase déjà décomposée, n'est-ce pas? Ñandú."))
UNICODE.append(unicodedata.normalize("NFD", "한국어 자모 분해"))
UNICODE.append(unicodedata.normalize("NFD", "Tiếng Việt phân tách"))

LONG = [
    "a" * 1000,
    "supercalifragilisticexpialidocious" * 20,
    "ab" * 500,
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "https://example.com/" + "very-long-path-segment/" * 30 + "?q=" + "x" * 100,
    "0123456789" * 50,
    "的" * 500,
    "🙂" * 200,
    "ा" * 100,
    "\u0301" * 50,
    "A" * 300 + "b" * 300,
    "x" * 255,
    "y" * 256,
    "z" * 257,
]


def long_texts(rng):
    out = []
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out.append("".join(rng.choice(alphabet) for _ in range(3000)) + "==")
    out.append("".join(rng.choice("0123456789abcdef") for _ in range(512)))
    words = " ".join(ENGLISH)
    out.append((words + "\n") * 8)
    out.append("\n".join(CODE))
    out.append("".join(CJK) * 3)
    return out


FRAGMENTS = ENGLISH + CODE + CJK + RTL + INDIC + SOUTHEAST_ASIAN + EMOJI + NUMBERS + CONTRACTIONS + SPECIAL + PARTIAL_SPECIAL + UNICODE
JOINERS = ["", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", "   "]


def mixtures(rng, count):
    out = []
    for _ in range(count):
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(2, 5))]
        text = parts[0]
        for part in parts[1:]:
            text += rng.choice(JOINERS) + part
        out.append(text)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "tests/tokenizer/corpus.json"))
    args = parser.parse_args()
    rng = random.Random(20240601)
    categories = [
        ("empty", [""]),
        ("english", ENGLISH),
        ("code", CODE),
        ("cjk", CJK),
        ("rtl", RTL),
        ("indic", INDIC),
        ("southeast_asian", SOUTHEAST_ASIAN),
        ("emoji", EMOJI),
        ("whitespace", WHITESPACE),
        ("numbers", NUMBERS),
        ("contractions", CONTRACTIONS),
        ("special_tokens", SPECIAL),
        ("partial_special_tokens", PARTIAL_SPECIAL),
        ("unicode", UNICODE),
        ("long", LONG + long_texts(rng)),
        ("mixed", mixtures(rng, 160)),
    ]
    cases = []
    for category, texts in categories:
        for i, text in enumerate(texts):
            cases.append({"name": f"{category}/{i:03d}", "text": text})
    Path(args.out).write_text(json.dumps({"cases": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
