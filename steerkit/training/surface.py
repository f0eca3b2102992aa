"""Surface forms of one text: the pure string transforms behind augmentation and evaluation views.

``lowercase``; ``tokenize`` (Penn-Treebank-style spacing, as in SST and the s-nlp sentences: ``it's good.`` ->
``it 's good .``); ``detokenize`` (the reverse, with sentence capitalisation); ``strip_punctuation``; and
``obfuscate`` (spelling variants of the words in a lexicon: letter swaps, dropped letters, spaced-out letters,
leetspeak, a starred vowel); and ``denounce`` (counter-speech: the text quoted inside a sentence that rejects it,
:data:`DENOUNCE_FRAMES`; an augmentation view gives such copies their own label). Every random choice is a pure
function of a string key.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

Transform = Literal["lowercase", "tokenize", "detokenize", "strip_punctuation", "obfuscate", "denounce"]

#: Counter-speech frames for ``denounce``: a hateful text quoted in order to reject it is not hateful (the
#: distinction the issue-26 data teaches). Written for training; the functional test cases
#: (tests/functional/toxicity.jsonl) use other wording and are checked not to share a frame (tests/unit).
#: The rejection comes first in some frames and last in others, since a causal reward model reads left to right.
DENOUNCE_FRAMES = (
    'Someone in the comments wrote "{}" and that is pure bigotry. Nobody deserves to be talked about like that.',
    'Please stop posting things like "{}". It hurts real people.',
    '"{}" is a hateful lie, and I will not stay quiet when I hear it.',
    'My uncle kept repeating "{}" at dinner, and I told him that is prejudice and it does not belong at our table.',
    'It makes me sad that anyone believes "{}". We are all human beings.',
    'Statements like "{}" are discrimination, plain and simple, and they should be called out.',
    'I reported a post that said "{}" because it attacked people for who they are.',
    'No, "{}" is not just an opinion. It is hate speech, and it has real victims.',
    # reported speech, no quotation marks: counter-speech often paraphrases what it rejects
    'The idea that {} is a racist myth, and repeating it only spreads prejudice.',
    'Anyone who tells you that {} is pushing bigotry on you. Do not believe it.',
    'My teacher explained why claims like {} are harmful stereotypes with no basis in fact.',
    'When my coworker said {}, the whole team told him that kind of talk is discriminatory.',
)

_CLITICS = re.compile(r"(?i)(\w)('s|'re|'ve|'ll|'d|'m|n't)\b")
_PUNCT = re.compile(r"([.,!?;:()\"])")
_SPACES = re.compile(r"\s+")
_LEET = {"a": "@", "e": "3", "i": "1", "o": "0", "s": "$", "t": "7"}


def tokenize_spacing(text: str) -> str:
    """Penn-Treebank-style spacing, as in SST and the s-nlp sentences."""
    text = _CLITICS.sub(r"\1 \2", text)
    text = _PUNCT.sub(r" \1 ", text)
    return _SPACES.sub(" ", text).strip()


def detokenize(text: str) -> str:
    """Undo PTB spacing and capitalise sentences and the pronoun "i"."""
    for token, plain in (("-lrb-", "("), ("-rrb-", ")"), ("``", '"'), ("''", '"')):
        text = text.replace(token, plain)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    text = re.sub(r" ([.,!?;:)])", r"\1", text)
    text = re.sub(r"\( ", "(", text)
    text = re.sub(r"\bi\b", "I", text)
    return re.sub(r"(^|[.!?] )([a-z])", lambda m: m.group(1) + m.group(2).upper(), text.strip())


def strip_punctuation(text: str) -> str:
    return _SPACES.sub(" ", re.sub(r"[^\w\s']", " ", text)).strip()


def unit(key: str) -> float:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64


def obfuscate_word(word: str, u: float) -> str:
    """One spelling variant of ``word`` chosen by ``u`` in [0, 1): swap, drop, space out, leet or star a vowel."""
    if len(word) < 3:
        return word
    kind, v = int(u * 5), (u * 5) % 1
    if kind == 0:  # swap two adjacent inner letters
        i = 1 + int(v * (len(word) - 2))
        i = min(i, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:  # drop an inner letter
        i = 1 + int(v * (len(word) - 2))
        return word[:i] + word[i + 1:]
    if kind == 2:  # spaced-out letters
        return " ".join(word)
    if kind == 3:  # leetspeak on every substitutable letter
        return "".join(_LEET.get(c, c) for c in word)
    vowels = [i for i, c in enumerate(word) if c in "aeiou" and 0 < i < len(word) - 1]  # star a vowel
    return word[:vowels[0]] + "*" + word[vowels[0] + 1:] if vowels else word + word[-1]  # else double the end


def obfuscate(text: str, lexicon: set[str], key: str) -> str:
    def swap(m: re.Match) -> str:
        word = m.group(0)
        return obfuscate_word(word, unit(f"{key}:{m.start()}")) if word.lower() in lexicon else word

    return re.sub(r"[A-Za-z][A-Za-z']+", swap, text)


def denounce(text: str, key: str) -> str:
    """``text`` inside one counter-speech frame (chosen by ``key``): quoted, or reported without quotation marks
    (then with a lower-case first letter, as a clause)."""
    quoted = _SPACES.sub(" ", text.replace('"', "'")).strip().rstrip(".!?;: ")
    if not quoted:
        return text
    frame = DENOUNCE_FRAMES[int(unit(f"{key}:frame") * len(DENOUNCE_FRAMES))]
    if '"{}"' not in frame and not quoted[:2].isupper():  # a clause, unless it starts with an acronym ("US ...")
        quoted = quoted[0].lower() + quoted[1:]
    return frame.format(quoted)


def apply_transforms(text: str, transforms: list[str], lexicon: set[str], key: str) -> str:
    for name in transforms:
        if name == "denounce":
            text = denounce(text, key)
        elif name == "lowercase":
            text = text.lower()
        elif name == "tokenize":
            text = tokenize_spacing(text)
        elif name == "detokenize":
            text = detokenize(text)
        elif name == "strip_punctuation":
            text = strip_punctuation(text)
        else:
            text = obfuscate(text, lexicon, key)
    return text
