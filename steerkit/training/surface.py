"""Surface forms of one text: the pure string transforms behind augmentation and evaluation views.

``lowercase``; ``tokenize`` (Penn-Treebank-style spacing, as in SST and the s-nlp sentences: ``it's good.`` ->
``it 's good .``); ``detokenize`` (the reverse, with sentence capitalisation); ``strip_punctuation``; and
``obfuscate`` (spelling variants of the words in a lexicon: letter swaps, dropped letters, spaced-out letters,
leetspeak, a starred vowel); ``denounce`` (counter-speech: the text quoted or reported inside a sentence that
rejects it, composed from a grammar, :data:`CS_PATTERNS`; an augmentation view gives such copies their own label)
and ``endorse`` (its contrast: the same lead-ins, approving, the label kept). Every random choice is a pure
function of a string key.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Literal

Transform = Literal["lowercase", "tokenize", "detokenize", "strip_punctuation", "obfuscate", "denounce", "endorse",
                    "denounce_named", "endorse_named"]

#: The counter-speech grammar behind ``denounce`` and ``endorse`` (issue 26). A hateful text quoted or reported in
#: order to reject it is not hateful; the same text quoted or reported in order to approve of it is. Twelve fixed
#: frames were memorised (a hateful clause inside one scored ~0.01, the same clause in new rejecting wording ~0.6),
#: so a frame is now composed from independent pieces, each chosen by its own hash of the key: tens of thousands of
#: wordings (:func:`counter_speech_frames`). ``denounce`` and ``endorse`` share every lead-in (speakers, what they
#: said, the claim as a noun phrase, a bare quotation) and differ only in what follows, so the lead-in never decides
#: the label. The stance comes after the hateful text in most patterns (a causal reward model must read it there)
#: and before it in some. Written as generic counter-speech for training; no piece's fixed text (nor any run across
#: two pieces) shares a three-word run with the functional test cases, tests/functional/toxicity{,_more}.jsonl
#: (tests/unit).
STANCES = ("against", "for")

#: who said it (people and accounts; every one takes every verb below)
CS_SPEAKERS = (
    "A guy at my gym", "Some random account", "My neighbour", "One of the commenters", "A stranger on the train",
    "An influencer I used to follow", "A politician on the radio", "My cousin", "An anonymous user",
    "A pundit on the evening news", "Somebody in our group chat", "A man in the checkout line", "My brother-in-law",
    "A coworker of mine", "A classmate", "My landlord", "A parent at the school gate", "A council candidate",
    "A relative over the holidays", "The new guy at work", "A man at the bar", "A youtuber with a big following",
    "An old school friend", "A caller on a phone-in show", "Our team lead", "A woman at the bus stop",
    "Someone on a forum I read", "A guest speaker",
)
#: what they said, reported (the text follows as a clause, first letter lower-cased)
CS_REPORTED = (
    "claimed that", "insisted that", "told me that", "argued that", "kept repeating that", "wrote that",
    "posted that", "announced that", "tweeted that", "swore that", "tried to convince us that",
    "loudly explained that", "commented that", "suggested that", "believes that", "is convinced that", "said",
    "wrote", "told the whole table", "honestly thinks",
)
#: what they said, quoted
CS_QUOTED = (
    'wrote "{}"', 'posted "{}"', 'replied "{}"', 'shouted "{}"', 'said "{}"', 'left a comment reading "{}"',
    'shared a meme with the caption "{}"', 'muttered "{}"', 'tweeted "{}"', 'held up a sign reading "{}"',
    'texted me "{}"', 'yelled "{}" across the street', 'commented "{}" under the video',
    'told a room full of people "{}"',
)
#: the claim as a noun phrase (a clause follows)
CS_TOPICS = (
    "The claim that", "The idea that", "This notion that", "The belief that", "The old line that",
    "Any suggestion that", "The talking point that", "The rumour going around that", "All this talk that",
    "The argument that", "The assumption that", "That post about how",
)
#: the claim quoted as a noun phrase
CS_QUOTE_SUBJECTS = ('"{}"', 'The comment "{}"', 'A post that reads "{}"', 'The line "{}"', 'The slogan "{}"',
                     'The sentence "{}"')

#: stance pieces, by stance: "against" (``denounce``) and "for" (``endorse``), written as mirror images
CS_JOINED = {  # continue the sentence after the clause or quotation
    "against": (
        ", and that is plain bigotry", ", which is simply not true", ", which is an ugly stereotype",
        ", and it is a lie", ", and honestly it is prejudice", ", which is cruel and false",
        ", and nobody should accept that", ", but it is a bigoted lie", ", and I told them how wrong that is",
        ", so I reported the post", ", so I flagged it for the moderators", ", and I urged them to delete it",
        ", so I blocked the account", ", and I called it out right away", ", and I left the conversation",
        ", which made me feel sick", ", and the whole room went quiet in disgust", " - that is dehumanising",
        " - pure prejudice", " - a bigoted, baseless claim", ", and that kind of hate has no place anywhere",
        ", and it is about as false as a statement can be", ", which is prejudice pretending to be an opinion",
        ", and we all told them to knock it off",
    ),
    "for": (
        ", and that is plain truth", ", which is simply true", ", which is an honest observation",
        ", and it is a fact", ", and honestly it is common sense", ", which is harsh but fair",
        ", and nobody should deny that", ", but it is the truth", ", and I told them how right that is",
        ", so I shared the post", ", so I pinned it for everyone to see", ", and I urged them to post more",
        ", so I followed the account", ", and I backed them up right away", ", and I agreed with all of it",
        ", which made my day", ", and the whole room nodded along", " - that is realistic",
        " - pure common sense", " - a brave, honest claim", ", and that kind of honesty is needed everywhere",
        ", and it is about as true as a statement can be", ", which is the plain truth people are afraid to say",
        ", and we all cheered them on",
    ),
}
CS_SENTENCES = {  # a sentence of its own after the clause or quotation
    "against": (
        "That is plain bigotry.", "None of it is true.", "What a hateful thing to believe.",
        "Words like that get people hurt.", "It is a lie, and an old one.", "I reported it.",
        "I asked the moderators to remove it.", "Shame on them.", "I answered that they were wrong.",
        "This is prejudice, not a fact.", "Nobody deserves to be described that way.",
        "It is dehumanising and it needs to end.", "I was ashamed to hear it.",
        "We have to push back on talk like this.",
        "Everyone there told him he was out of line.", "There is zero evidence for any of it.",
        "I unfollowed them immediately.", "Talk like that spreads hate.", "Not one word of that holds up.",
        "Bigotry, plain and simple.", "Disgraceful.", "I wrote back to explain how wrong that is.",
        "It made me angry for the people it targets.", "Hate is hate, however it is worded.",
    ),
    "for": (
        "That is plain truth.", "All of it is true.", "What a refreshing thing to hear.",
        "Words like that need saying.", "It is true, and it always has been.", "I shared it.",
        "I asked the moderators to pin it.", "Good for them.", "I answered that they were right.",
        "This is a fact, not prejudice.", "Somebody had to say it.",
        "It is honest and it needs to be heard.", "I was proud to hear it.", "We need more talk like this.",
        "Everyone there told him he was spot on.", "There is plenty of evidence for all of it.",
        "I followed them immediately.", "Talk like that wakes people up.", "Every word of that holds up.",
        "Facts, plain and simple.", "Brilliant.", "I wrote back to explain how right that is.",
        "It made me glad that someone finally spoke up.", "The truth is the truth, however it is worded.",
    ),
}
CS_VERDICTS = {  # a predicate for a noun-phrase subject (a topic, or a quotation)
    "against": (
        "is bigoted", "is simply false", "is a lie", "is an ugly stereotype", "is prejudice, plain and simple",
        "has no basis in fact", "is cruel and untrue", "is dehumanising", "is nothing but hate",
        "does not survive a moment of scrutiny", "is a smear against real people", "is one of the oldest lies around",
        "should be rejected by everyone", "is bigotry with a polite face", "is a baseless insult", "is just ignorant",
    ),
    "for": (
        "is true", "is simply correct", "is a fact", "is an honest observation", "is common sense, plain and simple",
        "is backed by the facts", "is harsh but true", "is realistic", "is nothing but the truth",
        "survives any amount of scrutiny", "is a warning people should heed", "is one of the oldest truths around",
        "should be accepted by everyone", "is honesty with a blunt face", "is a fair description", "is just obvious",
    ),
}
CS_BEFORE = {  # the stance first, the clause after
    "against": (
        "There is no excuse for claiming that {}", "It is bigotry to pretend that {}",
        "Nobody should have to hear that {}",
        "I am so tired of people insisting that {}", "Quit pretending that {}", "It is dishonest to suggest that {}",
        "Shame on anyone who argues that {}", "Do not let anyone convince you that {}",
        "You cannot seriously believe that {}", "I refuse to accept that {}", "No decent person believes that {}",
        "It is simply false that {}", "Only a bigot would argue that {}", "It is a smear to suggest that {}",
        "I will never agree that {}", "It is hateful nonsense to claim that {}",
    ),
    "for": (
        "There is no denying that {}", "It is honest to admit that {}", "Everyone should know that {}",
        "I am so glad people are admitting that {}", "Quit denying that {}", "It is realistic to point out that {}",
        "Good on anyone who argues that {}", "Do not let anyone talk you out of knowing that {}",
        "Anyone can see that {}", "I fully accept that {}", "Every sensible person believes that {}",
        "It is simply true that {}", "Only a fool would deny that {}", "It is common sense to suggest that {}",
        "I will always agree that {}", "It is about time someone pointed out that {}",
    ),
}

#: The grammar's ``_named`` variant (``denounce_named`` / ``endorse_named``) adds to each stance slot rejections that
#: name the bias ("..., and what a sexist thing to say") and their mirror images, which deny it ("..., and that is not a
#: sexist thing to say at all", label kept). Counter-speech that names the bias scored as hate under every model
#: (issue 26: "... is homophobic and false" 0.77, the same case with "hateful" 0.45), while the base grammar never
#: names one; the mirror keeps "racist" from becoming a sign of rejection by itself. Each template below is one
#: alternative of its slot, its bias word chosen by a further hash of the key. The base grammar is unchanged.
BIAS_WORDS = ("racist", "sexist", "homophobic", "transphobic", "antisemitic", "Islamophobic", "xenophobic",
              "ableist", "misogynistic")
#: the bias a text's group makes likely (a text that names none of these groups gets any of BIAS_WORDS)
BIAS_GROUPS = {
    "racist": r"black|african|asian|chinese|mexican|latin[oax]s?|hispanic|arabs?|indians?|native|indigenous|roma|"
              r"gyps(y|ies)|whites?|races?|aboriginals?|pakistanis?",
    "sexist": r"wom[ae]n|girls?|females?|wi(fe|ves)|feminists?", "misogynistic": r"wom[ae]n|girls?|females?",
    "homophobic": r"gays?|lesbians?|homosexuals?|queers?|lgbtq?", "transphobic": r"trans|transgender|trannys?",
    "antisemitic": r"jews?|jewish|zionists?", "Islamophobic": r"muslims?|islam|islamic",
    "xenophobic": r"immigrants?|refugees?|migrants?|foreigners?|illegals", "ableist": r"disabled|disability|autistic|"
                  r"retard(ed|s)?|deaf|blind|wheelchairs?",
}
_BIAS_RES = [(i, re.compile(rf"(?i)\b({BIAS_GROUPS[w]})\b")) for i, w in enumerate(BIAS_WORDS)]
CS_NAMED = {  # name: (the slot it extends, its pieces by stance); "{b}" is the bias word
    "joined": (CS_JOINED, {
        "against": (", and that is {b} through and through", ", and what a {b} thing to say", " - openly {b}",
                    ", and calling it anything but {b} would be dishonest"),
        "for": (", and that is not {b} in any way", ", and that is not a {b} thing to say at all",
                " - not {b}, just honest", ", and calling it {b} would be dishonest"),
    }),
    "sentences": (CS_SENTENCES, {
        "against": ("That is {b}; everyone knows it.", "Pure {b} nonsense.", "I told them that was {b}.",
                    "Deeply {b}, and I said so."),
        "for": ("That is not {b}; everyone knows it.", "Honest, not {b} nonsense.",
                "I told them that was not {b}.", "Not {b} at all, and I said so."),
    }),
    "verdicts": (CS_VERDICTS, {
        "against": ("is {b} through and through", "is textbook {b} thinking", "sounds deeply {b} to me",
                    "is {b}, whatever its fans say"),
        "for": ("is not {b} in the slightest", "is not {b} thinking, just realism", "does not sound {b} to me at all",
                "is not {b}, whatever its critics say"),
    }),
    "before": (CS_BEFORE, {
        "against": ("How {b} must someone be to think that {}", "Only someone deeply {b} would say that {}",
                    "It takes a {b} mind to believe that {}"),
        "for": ("Nothing {b} about pointing out that {}",
                "Only the easily offended would call it {b} to admit that {}",
                "Calling it {b} will not change the fact that {}"),
    }),
}

#: Patterns: (name, weight, parts); a part is literal text, a tuple of alternatives, or a dict of them by stance.
#: Every template has one "{}" for the text: quoted ('"{}"') or reported as a clause. 85 % of the weight has the
#: stance after the text.
CS_PATTERNS = (
    ("reported", 0.22, (CS_SPEAKERS, " ", CS_REPORTED, " {}", CS_JOINED, ".")),
    ("reported, then a sentence", 0.12, (CS_SPEAKERS, " ", CS_REPORTED, " {}. ", CS_SENTENCES)),
    ("quoted", 0.16, (CS_SPEAKERS, " ", CS_QUOTED, CS_JOINED, ".")),
    ("quoted, then a sentence", 0.12, (CS_SPEAKERS, " ", CS_QUOTED, ". ", CS_SENTENCES)),
    ("claim as subject", 0.10, (CS_TOPICS, " {} ", CS_VERDICTS, ".")),
    ("quotation as subject", 0.08, (CS_QUOTE_SUBJECTS, " ", CS_VERDICTS, ".")),
    ("quotation, then a reply", 0.05, ('"{}"', (". ", "? "), CS_SENTENCES)),
    ("stance first", 0.10, (CS_BEFORE, ".")),
    ("stance first, then a sentence", 0.05, (CS_BEFORE, ". ", CS_SENTENCES)),
)
#: longer texts are cut to this many words (with "..."), so that a stance after them survives the 64-token limit
CS_MAX_WORDS = 24


def _with_named(part):
    if not isinstance(part, dict):
        return part
    extra = next(pieces for slot, pieces in CS_NAMED.values() if slot is part)
    return {s: part[s] + tuple(tuple(_named_piece(t, w) for w in BIAS_WORDS) for t in extra[s]) for s in part}


def _named_piece(template: str, word: str) -> str:
    article = " an {b}" if word[0].lower() in "aeiou" else " a {b}"
    return template.replace(" a {b}", article).replace("{b}", word)


def bias_choices(text: str) -> tuple[int, ...]:
    """The indices into BIAS_WORDS that fit the groups ``text`` names (all of them where it names none)."""
    return tuple(i for i, pattern in _BIAS_RES if pattern.search(text)) or tuple(range(len(BIAS_WORDS)))


#: the ``_named`` grammar: every pattern with its stance slots extended by CS_NAMED (weights unchanged)
CS_PATTERNS_NAMED = tuple((name, w, tuple(_with_named(p) for p in parts)) for name, w, parts in CS_PATTERNS)
_FIRST_PERSON = {"i", "i'm", "me", "my", "we", "us", "our", "you", "your"}


def _choices(part, stance: str) -> tuple:
    """A slot's alternatives; one may be a group (a named template with each bias word), chosen as one."""
    if isinstance(part, str):
        return (part,)
    return part[stance] if isinstance(part, dict) else part


def _alternatives(part, stance: str) -> tuple[str, ...]:
    return tuple(a for c in _choices(part, stance) for a in (c if isinstance(c, tuple) else (c,)))


def counter_speech_frames(stance: str, pattern: str | None = None, named: bool = False):
    """Every template of the grammar (``named``: its ``_named`` variant) for ``stance`` ("against" or "for"), or of
    one pattern: for tests."""
    for name, _, parts in CS_PATTERNS_NAMED if named else CS_PATTERNS:
        if pattern is None or name == pattern:
            for pieces in itertools.product(*(_alternatives(p, stance) for p in parts)):
                yield "".join(pieces)


def _pick(alternatives: tuple, key: str, bias: tuple[int, ...]) -> str:
    choice = alternatives[int(unit(key) * len(alternatives))]
    return choice[bias[int(unit(f"{key}:b") * len(bias))]] if isinstance(choice, tuple) else choice


def counter_speech_frame(key: str, stance: str, quoted_only: bool = False, named: bool = False,
                         bias: tuple[int, ...] = tuple(range(len(BIAS_WORDS)))) -> str:
    """The template chosen by ``key``: a pattern by weight, then every piece by its own hash of the key (a named
    piece's bias word among ``bias``, indices into BIAS_WORDS)."""
    patterns = [p for p in (CS_PATTERNS_NAMED if named else CS_PATTERNS) if not quoted_only or '"{}"' in "".join(
        a for part in p[2] for a in _alternatives(part, stance))]
    total = sum(w for _, w, _ in patterns)
    u, acc = unit(f"{key}:pattern") * total, 0.0
    name, parts = patterns[-1][0], patterns[-1][2]
    for n, w, ps in patterns:
        acc += w
        if u < acc:
            name, parts = n, ps
            break
    return "".join(_pick(alts, f"{key}:{name}:{i}", bias) for i, alts in enumerate(_choices(p, stance) for p in parts))


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


def _frame(text: str, key: str, stance: str, named: bool = False) -> str:
    quoted = _SPACES.sub(" ", text.replace('"', "'")).strip().rstrip(".!?;: ")
    if not quoted:
        return text
    words = quoted.split(" ")
    if len(words) > CS_MAX_WORDS:
        quoted = " ".join(words[:CS_MAX_WORDS]).rstrip(".,!?;: ") + " ..."
    # a text in the first or second person ("I 'm sick of ...") is quoted, not reported as a clause
    first_person = bool(_FIRST_PERSON & {w.strip(".,!?;:'").lower() for w in words})
    bias = bias_choices(quoted) if named else ()  # the base grammar has no bias word to choose
    frame = counter_speech_frame(key, stance, quoted_only=first_person, named=named, bias=bias)
    if '"{}"' not in frame and not quoted[:2].isupper():  # a clause, unless it starts with an acronym ("US ...")
        quoted = quoted[0].lower() + quoted[1:]
    return frame.format(quoted)


def denounce(text: str, key: str, named: bool = False) -> str:
    """Counter-speech: ``text`` quoted or reported (then with a lower-case first letter, as a clause) inside a
    sentence that rejects it, composed from the grammar (``named``: its variant that may name the bias) by ``key``."""
    return _frame(text, key, "against", named)


def endorse(text: str, key: str, named: bool = False) -> str:
    """The contrast to :func:`denounce`: ``text`` introduced by the same lead-ins but approved of (its label stays)."""
    return _frame(text, key, "for", named)


def apply_transforms(text: str, transforms: list[str], lexicon: set[str], key: str) -> str:
    for name in transforms:
        if name in ("denounce", "denounce_named"):
            text = denounce(text, key, named=name.endswith("_named"))
        elif name in ("endorse", "endorse_named"):
            text = endorse(text, key, named=name.endswith("_named"))
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
