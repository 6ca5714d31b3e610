"""How the `qa` reward reads a short answer, as a person marking it would (docs/rewards.md, "Short text answers").

Both the reference and the model's answer are first written one way (`normalise`): LaTeX and markdown dropped,
numbers in digits ("a dozen" = 12, "minus five" = -5, "three quarters" = 3/4, "1.2 × 10^3" = 1.2e3, "100 000" =
"1.000.000" / 1000 = 100000, "2,5" = 2.5), ordinals and Roman numerals after a name as numbers ("Henry the Eighth" =
"Henry VIII" = "henry 8"), and common aliases as one name ("USA" = "United States", "St." = "Saint", "WWII" =
"World War 2"). The reference then says what kind of answer it wants: a date, a time of day, a quantity (a number
with maybe a unit, a currency or a noun) or text, and the answer is searched for that.

A match only counts where the answer commits to it: a match that is negated ("not Paris", "90, not 100"), bounded
("more than 100", "at least 8"), one of several candidates ("4 or 5", "6-8", "Paris, Lyon or Nice", "between 6 and
10") or hedged anywhere in the answer ("maybe", "not sure") scores nothing, so listing candidates never pays.
Everything here is regular expressions over short strings: tens of microseconds a pair.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

# ---------------------------------------------------------------------------------------------------- number words

_SMALL = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NUMBER_WORD = "|".join(sorted([*_SMALL, *_TENS, *_SCALES], key=len, reverse=True))
_SPELLED = re.compile(rf"\b(?:(?:a|one)\s+(?:hundred|thousand|million|billion)|{_NUMBER_WORD})\b"
                      rf"(?:(?:\s+|-|\s+and\s+)(?:{_NUMBER_WORD})\b)*", re.IGNORECASE)
_SPELLED_WORDS = frozenset([*_SMALL, *_TENS, *_SCALES])
_WORD = re.compile(r"[^\W\d_]+")
_DIGIT = re.compile(r"\d")
_DIGIT_SCALE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(k|thousand|million|billion|bn)\b", re.IGNORECASE)
_MONEY_SCALE = re.compile(r"(?<=[$€£¥])(\d+(?:\.\d+)?)\s*(m|mn|b)\b", re.IGNORECASE)  # $20m, £1.5bn


def _spelled_value(words: str) -> int | None:
    """'twenty-one' -> 21, 'a hundred' -> 100, 'two thousand five hundred' -> 2500; None if not one number."""
    total = current = 0
    last = ""
    for word in re.split(r"[\s-]+", words.lower()):
        if word == "and":
            continue
        if word in ("a", "one") and last == "":
            current, last = 1, "unit"
        elif word in _SMALL and last in ("", "tens", "scale"):
            current, last = current + _SMALL[word], "unit"
        elif word in _TENS and last in ("", "scale"):
            current, last = current + _TENS[word], "tens"
        elif word == "hundred" and last in ("unit", "tens") and current % 100:
            current, last = current * 100, "scale"
        elif word in _SCALES and word != "hundred" and last in ("unit", "tens", "scale") and current:
            total, current, last = total + current * _SCALES[word], 0, "scale"
        else:
            return None
    return total + current


def spell_numbers(text: str) -> str:
    """Numbers written in words or with a scale as digits: 'twenty-one' -> '21', 'a hundred' -> '100', 'two
    thousand' -> '2000', '1k' / '1 thousand' -> '1000', '2.5 million' -> '2500000'. A run of words that is not one
    number ('one two') is left as it is."""
    def words(match: re.Match) -> str:
        value = _spelled_value(match.group(0))
        return match.group(0) if value is None else str(value)

    def scaled(match: re.Match) -> str:
        from decimal import Decimal

        scale = match.group(2).lower()
        factor = 10**9 if scale in ("bn", "b") else 10**6 if scale in ("m", "mn") else _SCALES.get(scale, 1000)
        return format((Decimal(match.group(1)) * factor).normalize(), "f")

    if not _SPELLED_WORDS.isdisjoint(_WORD.findall(text.lower())):
        text = _SPELLED.sub(words, text)
    if not _DIGIT.search(text):
        return text
    return _DIGIT_SCALE.sub(scaled, _MONEY_SCALE.sub(scaled, text) if "m" in text or "b" in text else text)


_ORDINALS = {w: i for i, w in enumerate(
    "_ first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth fourteenth "
    "fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split()) if i}
_DENOMINATORS = {"half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4,
                 "fourths": 4, "fifth": 5, "fifths": 5, "sixth": 6, "sixths": 6, "eighth": 8, "eighths": 8,
                 "tenth": 10, "tenths": 10}

# ------------------------------------------------------------------------------------------- writing one way


def _roman(numeral: str) -> int | None:
    values = {"I": 1, "V": 5, "X": 10, "L": 50}
    if not re.fullmatch(r"L?X{0,3}(?:IX|IV|V?I{0,3})", numeral) or not numeral:
        return None
    total = 0
    for i, ch in enumerate(numeral):
        value = values[ch]
        total += -value if i + 1 < len(numeral) and values[numeral[i + 1]] > value else value
    return total


_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
_SUBSCRIPT = str.maketrans("₀₁₂₃₄₅₆₇₈₉", "0123456789")
_LATEX = [(re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"\1/\2"),
          (re.compile(r"\\(?:text|mathrm|textbf|mathbf|operatorname)\s*\{([^{}]*)\}"), r"\1"),
          (re.compile(r"\^\s*\{?\\circ\}?"), "°"), (re.compile(r"\\(?:times|cdot)"), "×"),
          (re.compile(r"\\([%$])"), r"\1"), (re.compile(r"\\[,;:! ]|\\(?:left|right|quad)"), " ")]
# A Roman numeral after a name is the name's number ("Henry VIII", "World War II", "Louis XIV"). One letter only
# where it cannot be the pronoun: "V" and "X" after a name, "I" after "War" or closing the text.
_ROMAN_AFTER_NAME = re.compile(r"\b([A-Z][a-z]+ )([IVXL]{2,}|[VX]|I(?=\s*(?:[.,;:!?)]|$)))\b(?!')")
_ROMAN_HINT = re.compile(r"[A-Z][a-z]+ [IVXL]|War I")
_WAR_I = re.compile(r"(?<=\bWar )I\b")
_CASED_ALIASES = [(r"\bU\.\s?S\.(?:\s?A\.?)?|\bUSA?\b(?!\$)", "United States"),
                  (r"\bU\.\s?K\.?|\bUK\b", "United Kingdom"), (r"\bU\.\s?N\.?|\bUN\b", "United Nations"),
                  (r"\bEU\b", "European Union")]
# Two-way aliases: spellings of one name (the reference and the answer are both rewritten).
_ALIASES = [
    (r"\b(?:ww\s?(?:ii|2)|world war (?:ii|two)|(?:second|2) world war)\b", "world war 2"),
    (r"\b(?:ww\s?(?:i|1)|world war (?:i|one)|(?:first|1) world war|great war)\b", "world war 1"),
    (r"\b(?:united states of america|usa|(?<!south )(?<!north )(?<!latin )(?<!central )america)\b",
     "united states"),
    (r"\b(?:great britain|britain|uk)\b", "united kingdom"), (r"\b(?:ussr|soviet russia)\b", "soviet union"),
    (r"\buae\b", "united arab emirates"), (r"\bnyc\b", "new york city"), (r"\bholland\b", "netherlands"),
    (r"\bd\.\s?c\b\.?", "dc"), (r"\bburma\b", "myanmar"), (r"\bpeking\b", "beijing"), (r"\bbombay\b", "mumbai"),
    (r"(?<![\d.])\bst\.?\s+(?=[a-z])", "saint "), (r"(?<![\d.])\bmt\.?\s+(?=[a-z])", "mount "),
    (r"\bjfk\b", "john f kennedy"), (r"\bmlk\b", "martin luther king"), (r"\bfdr\b", "franklin d roosevelt"),
    (r"\s+(?:jr|sr)\b\.?", ""),  # Martin Luther King Jr.
]
# a word one of the aliases needs: the text is searched for them only when it holds one
_ALIAS_WORDS = frozenset("ww wwi wwii world great united usa america britain uk ussr soviet uae nyc holland burma "
                         "peking bombay st mt jfk mlk fdr jr sr d".split())
# One-way aliases: a formula or symbol is a right answer for the substance's name, but a question whose reference
# is the formula asks for the formula ("H2O" against "water" is 0).
_FORMULAS = [
    (r"\bCO2\b", "carbon dioxide"), (r"\bCO\b", "carbon monoxide"), (r"\bH2O\b", "water"), (r"\bO2\b", "oxygen"),
    (r"\bO3\b", "ozone"), (r"\bN2\b", "nitrogen"), (r"\bH2\b", "hydrogen"), (r"\bNaCl\b", "sodium chloride"),
    (r"\bCH4\b", "methane"), (r"\bNH3\b", "ammonia"), (r"\bH2SO4\b", "sulfuric acid"),
    (r"\bHCl\b", "hydrochloric acid"),
    (r"\bAu\b", "gold"), (r"\bAg\b", "silver"), (r"\bFe\b", "iron"), (r"\bCu\b", "copper"), (r"\bPb\b", "lead"),
    (r"\bHg\b", "mercury"), (r"\bNa\b", "sodium"), (r"\bSn\b", "tin"), (r"\bZn\b", "zinc"), (r"\bNe\b", "neon"),
]
_ORDINAL_WORD = "|".join(sorted(_ORDINALS, key=len, reverse=True))
_FRACTION_WORDS = re.compile(r"\b(\d+|a|one)[\s-]+(" + "|".join(sorted(_DENOMINATORS, key=len, reverse=True))
                             + r")\b")
_REWRITES = [  # in order, on lower-case text; each is tried only where one of its trigger strings is in the text
    (re.compile(r"\b(\d+)(?:st|nd|rd|th)\b"), r"\1", ("st", "nd", "rd", "th")),  # 8th -> 8
    (re.compile(rf"\bthe\s+({_ORDINAL_WORD})\b"), lambda m: str(_ORDINALS[m.group(1)]), ("the",)),  # Henry the Eighth
    (re.compile(r"\b(first|second)(?= world war\b)"), lambda m: "1" if m.group(1) == "first" else "2", ("world war",)),
    (re.compile(r"\bhalf (?:a|an) dozen\b"), "6", ("dozen",)),
    (re.compile(r"\b(\d+) dozen\b"), lambda m: str(12 * int(m[1])), ("dozen",)),
    (re.compile(r"\b(?:a\s+)?dozen\b"), "12", ("dozen",)),
    (re.compile(r"\b(\d+) and (?:a|one) half\b"), r"\1.5", ("half",)),
    (re.compile(r"\bhalf (?:a|an)\b"), "0.5", ("half",)),
    (_FRACTION_WORDS, lambda m: f"{1 if m[1] in ('a', 'one') else m[1]}/{_DENOMINATORS[m[2]]}",
     ("half", "halves", "third", "quarter", "fourth", "fifth", "sixth", "eighth", "tenth")),
    (re.compile(r"\bhalf\b"), "1/2", ("half",)),
    (re.compile(r"\b(?:minus|negative)\s+(?=\d)"), "-", ("minus", "negative")),
    (re.compile(r"\b(?:none|nil|nought|naught)\b"), "0", ("none", "nil", "ught")),
    (re.compile(r"\b(\d+(?:\.\d+)?)\s*((?:°\s*[cf]?|degrees?(?: celsius| fahrenheit)?)\s+)?below "
                r"(?:zero|freezing|0)\b(?!\.\d)"), lambda m: f"-{m[1]} {m[2] or ''}", ("below",)),
    (re.compile(r"(\d(?:\.\d+)?)\s*[×x*·]\s*10\s*(?:\^|\*\*)\s*\{?\s*([+-]?\d+)\s*\}?"), r"\1e\2", ("^", "**")),
    (re.compile(r"(?<![\w.])10\s*(?:\^|\*\*)\s*\{?\s*([+-]?\d+)\}?"), r"1e\1", ("^", "**")),
]
_REWRITES_BY_TRIGGER: dict[str, list[int]] = {}
for _i, (_, _, _triggers) in enumerate(_REWRITES):
    for _trigger in _triggers:
        _REWRITES_BY_TRIGGER.setdefault(_trigger, []).append(_i)
_TRIGGER = re.compile("|".join(sorted({re.escape(t) for _, _, ts in _REWRITES for t in ts}, key=len, reverse=True)))
_NUMBER_FORMATS = [  # thousands and decimal separators other than "1,234.5", before number words are read
    (re.compile(r"(?<![\d.,])(\d{1,3}(?:\.\d{3})+),(\d+)\b(?![.,]\d)"), lambda m: m[1].replace(".", "") + "." + m[2]),
    (re.compile(r"(?<![\d.,])\d{1,3}(?:\.\d{3}){2,}\b(?![.,]\d)"), lambda m: m[0].replace(".", "")),
    (re.compile(r"(?<![\d.,])(\d+),(\d{1,2}|\d{4,})\b(?![.,]\d)"), r"\1.\2"),  # 2,5 -> 2.5 (1,000 stays)
    (re.compile(r"(?<![\d.,])\d{1,3}(?: \d{3})+\b(?![.,]\d)"), lambda m: m[0].replace(" ", "")),
    (re.compile(r"(?<=\d)-(?=\d)"), "–"),  # 6-8 is a range, not 6 and -8
]


def _one_pass(pairs: list[tuple[str, str]], flags: int = 0) -> functools.partial:
    """Several plain replacements as one regular expression (the first alternative that matches at a place wins)."""
    pattern = re.compile("|".join(f"(?P<g{i}>{p})" for i, (p, _) in enumerate(pairs)), flags)
    names = {f"g{i}": name for i, (_, name) in enumerate(pairs)}
    return functools.partial(pattern.sub, lambda m: names[m.lastgroup])


_CASED_ALIAS_SUB = _one_pass(_CASED_ALIASES)
_FORMULA_SUB = _one_pass(_FORMULAS)
# a formula has a digit after an element ("CO2"); the ones without ("NaCl", "Au") are named
_FORMULA_HINT = re.compile(r"[A-Z][a-z]?\d|\b(?:"
                           + "|".join(p[2:-2] for p, _ in _FORMULAS if not p[2:-2][-1].isdigit()) + r")\b")
_ALIAS_SUB = _one_pass(_ALIASES)


def _clean(text: str) -> str:
    """Unicode, LaTeX and markdown written one way; the case kept."""
    if not text.isascii():
        # 10³ is 10^3 and km² is km2 (the unit's spelling)
        text = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+", lambda m: "^" + m.group(0).translate(_SUPERSCRIPT), text)
        text = unicodedata.normalize("NFKD", text.translate(_SUBSCRIPT))  # ¾ -> 3⁄4, é -> e and an accent
        text = unicodedata.normalize("NFC", "".join(ch for ch in text if not unicodedata.combining(ch)))
        text = text.replace("−", "-").replace("’", "'").replace("⁄", "/")
    if "^" in text:
        text = re.sub(r"(?<=[A-Za-z])\^(\d)", r"\1", text)
    if "\\" in text or "^" in text:
        for pattern, repl in _LATEX:
            text = pattern.sub(repl, text)
    return re.sub(r"[*_`]+", " ", text) if "*" in text or "_" in text or "`" in text else text


@functools.lru_cache(maxsize=4096)
def normalise(text: str, formulas: bool = False) -> str:
    """The text written one way, lower case (see the module docstring); `formulas`: a chemical formula or element
    symbol also reads as the substance's name (done for the model's answer only)."""
    text = _clean(text)
    if _ROMAN_HINT.search(text):
        text = _WAR_I.sub("1", _ROMAN_AFTER_NAME.sub(lambda m: m[1] + str(_roman(m[2]) or m[2]), text))
    if "U" in text:
        text = _CASED_ALIAS_SUB(text)
    if formulas:
        text = _FORMULA_SUB(text)
    text = text.lower().replace("'", "")
    if _DIGIT.search(text):
        for pattern, repl in _NUMBER_FORMATS:
            text = pattern.sub(repl, text)
    text = spell_numbers(text)
    for i in sorted({i for trigger in _TRIGGER.findall(text) for i in _REWRITES_BY_TRIGGER[trigger]}):
        pattern, repl, _ = _REWRITES[i]
        text = pattern.sub(repl, text)
    if not _ALIAS_WORDS.isdisjoint(_WORD.findall(text)) or "ww" in text:
        text = _ALIAS_SUB(text)
    return text


_TOKEN = re.compile(r"(?<![\w.])-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:e[+-]?\d+)?(?:/\d+)?|\w+")
_ARTICLES = {"a", "an", "the"}


def tokens(text: str) -> list[tuple[str, int, int]]:
    """Words and numbers of a normalised text with where each stands; articles left out, numbers in one spelling."""
    out = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token[0].isdigit() or token[0] in "-.":
            value = number_value(token)
            token = _canonical(value) if value is not None else token
        if token not in _ARTICLES:
            out.append((token, match.start(), match.end()))
    return out


_PLAIN_NUMBER = re.compile(r"(-?)(\d*)(?:\.(\d+))?(?:e([+-]?\d+))?")


def _exact(text: str) -> Fraction:
    """A decimal numeral's exact value (Fraction(str) reads the same, several times slower)."""
    match = _PLAIN_NUMBER.fullmatch(text)
    if not match or not (match.group(2) or match.group(3)):
        raise ValueError(text)
    sign, whole, decimals, exponent = match.groups()
    value = Fraction(int((whole or "0") + (decimals or "")), 10 ** len(decimals or ""))
    if exponent:
        if abs(int(exponent)) > 400:  # beyond any float, and 10 ** 10 ** 8 would take minutes
            raise ValueError(text)
        value *= Fraction(10) ** int(exponent)
    return -value if sign else value


def number_value(token: str) -> Fraction | None:
    """'1,234.5' -> 1234.5, '3/4' -> 3/4, '1.2e3' -> 1200 (exact), else None."""
    try:
        if "/" in token:
            top, bottom = token.replace(",", "").split("/", 1)
            return _exact(top) / _exact(bottom)
        return _exact(token.replace(",", "").rstrip("."))
    except (ValueError, ZeroDivisionError):
        return None


def _canonical(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    return repr(as_float) if Fraction(repr(as_float)) == value else f"{value.numerator}/{value.denominator}"


# ---------------------------------------------------------------------------------------------------- units

# spelling -> readings (quantity, factor to the quantity's base unit, offset). A different unit of the same quantity
# is converted ("2 kg" = "2000 g", "7 ft" = "84 inches"); another quantity or currency never matches. A spelling
# with two readings ("pounds": money or mass; bare "degrees": either scale) matches either.
_UNIT_TABLE: dict[str, dict[float, str]] = {
    "mass": {1e-6: "µg mcg microgram micrograms", 1e-3: "mg milligram milligrams milligramme milligrammes",
             1.0: "g gr gram grams gramme grammes", 1e3: "kg kgs kilo kilos kilogram kilograms kilogramme kilogrammes",
             1e6: "t tonne tonnes metric_ton metric_tons ton tons", 28.349523125: "oz ounce ounces",
             453.59237: "lb lbs pound pounds", 6350.29318: "stone stones"},
    "length": {1e-9: "nm nanometre nanometres nanometer nanometers", 1e-6: "µm micron microns micrometre micrometres",
               1e-3: "mm millimetre millimetres millimeter millimeters", 1e-2: "cm centimetre centimetres "
               "centimeter centimeters", 1.0: "m metre metres meter meters", 1e3: "km kms kilometre kilometres "
               "kilometer kilometers", 0.0254: "in. inch inches \"", 0.3048: "ft feet foot '", 0.9144: "yd yard yards",
               1609.344: "mi mile miles", 1852.0: "nautical_mile nautical_miles nmi"},
    "area": {1.0: "m2 sq_m square_metre square_metres square_meter square_meters", 1e6: "km2 sq_km square_kilometre "
             "square_kilometres square_kilometer square_kilometers", 1e4: "ha hectare hectares",
             4046.8564224: "acre acres", 0.09290304: "sq_ft square_foot square_feet ft2",
             2589988.110336: "sq_mi square_mile square_miles mi2"},
    "time": {1e-9: "ns nanosecond nanoseconds", 1e-6: "µs microsecond microseconds",
             1e-3: "ms millisecond milliseconds", 1.0: "s sec secs second seconds", 60.0: "min mins minute minutes",
             3600.0: "h hr hrs hour hours", 86400.0: "day days", 604800.0: "week weeks", 1209600.0: "fortnight"},
    "month": {1.0: "month months"}, "year": {1.0: "year years yr yrs", 10.0: "decade decades",
                                             100.0: "century centuries", 1000.0: "millennium millennia"},
    "volume": {1e-3: "ml millilitre millilitres milliliter milliliters cc cm3", 1e-2: "cl centilitre centilitres",
               1.0: "l litre litres liter liters", 1e3: "m3 cubic_metre cubic_metres cubic_meter cubic_meters",
               3.785411784: "gal gallon gallons", 0.946352946: "quart quarts qt", 0.473176473: "pint pints pt",
               0.0295735295625: "fl_oz fluid_ounce fluid_ounces", 0.2365882365: "cup cups",
               0.01478676478125: "tbsp tablespoon tablespoons", 0.00492892159375: "tsp teaspoon teaspoons"},
    "speed": {1 / 3.6: "km/h kmh kph km_per_hour kilometres_per_hour kilometers_per_hour",
              0.44704: "mph miles_per_hour mi/h", 1.0: "m/s metres_per_second meters_per_second",
              0.514444: "knot knots kn"},
    "data_si": {1.0: "b byte bytes", 1e3: "kb kilobyte kilobytes", 1e6: "mb megabyte megabytes",
                1e9: "gb gigabyte gigabytes", 1e12: "tb terabyte terabytes", 1e15: "pb petabyte petabytes"},
    "data_binary": {1.0: "b byte bytes", 2.0**10: "kb kib kilobyte kilobytes kibibyte kibibytes",
                    2.0**20: "mb mib megabyte megabytes mebibyte mebibytes",
                    2.0**30: "gb gib gigabyte gigabytes gibibyte gibibytes",
                    2.0**40: "tb tib terabyte terabytes tebibyte tebibytes"},
    "bits": {1.0: "bit bits", 1e3: "kbit kbits kilobit kilobits", 1e6: "mbit mbits megabit megabits",
             1e9: "gbit gbits gigabit gigabits"},
    "energy": {1.0: "j joule joules", 1e3: "kj kilojoule kilojoules", 1e6: "mj megajoule megajoules",
               4.184: "cal calorie calories", 4184.0: "kcal kilocalorie kilocalories", 3.6e6: "kwh kilowatt_hour "
               "kilowatt_hours"},
    "power": {1.0: "w watt watts", 1e3: "kw kilowatt kilowatts", 1e6: "mw megawatt megawatts",
              1e9: "gw gigawatt gigawatts", 745.69987158227022: "hp horsepower"},
    "frequency": {1.0: "hz hertz", 1e3: "khz kilohertz", 1e6: "mhz megahertz", 1e9: "ghz gigahertz"},
    "voltage": {1.0: "v volt volts", 1e3: "kv kilovolt kilovolts", 1e-3: "mv millivolt millivolts"},
    "current": {1.0: "amp amps ampere amperes", 1e-3: "ma milliamp milliamps"},
    "pressure": {1.0: "pa pascal pascals", 1e3: "kpa kilopascal kilopascals", 1e5: "bar bars",
                 101325.0: "atm atmosphere atmospheres", 6894.757293168: "psi", 133.322387415: "mmhg"},
    "percent": {1.0: "% percent per_cent pct percentage_points"},
    "angle": {1.0: "° degree degrees deg", 57.29577951308232: "rad radian radians"},
    "usd": {1.0: "$ us$ usd dollar dollars us_dollars buck bucks", 0.01: "cent cents ¢"},
    "eur": {1.0: "€ eur euro euros", 0.01: "euro_cent euro_cents"}, "gbp": {1.0: "£ gbp pound pounds quid",
                                                                           0.01: "pence penny pennies"},
    "jpy": {1.0: "¥ jpy yen"}, "cny": {1.0: "cny rmb yuan renminbi"}, "inr": {1.0: "₹ inr rupee rupees rs"},
    "krw": {1.0: "₩ krw won"}, "rub": {1.0: "₽ rub ruble rubles rouble roubles"},
    "chf": {1.0: "chf franc francs swiss_francs"}, "cad": {1.0: "c$ cad canadian_dollars"},
    "aud": {1.0: "a$ au$ aud australian_dollars"}, "mxn": {1.0: "mxn peso pesos"},
    "sek": {1.0: "sek krona kronor krone kroner"}, "brl": {1.0: "r$ brl real reais"},
}
_TEMPERATURE = {"°c ºc celsius degrees_celsius degree_celsius centigrade": (1.0, 273.15),
                "°f ºf fahrenheit degrees_fahrenheit degree_fahrenheit": (5 / 9, 273.15 - 32 * 5 / 9),
                "kelvin kelvins °k": (1.0, 0.0), "° degree degrees deg": None}
UNITS: dict[str, tuple[tuple[str, float, float], ...]] = {}
for _quantity, _factors in _UNIT_TABLE.items():
    for _factor, _spellings in _factors.items():
        for _spelling in _spellings.split():
            _spelling = _spelling.replace("_", " ")  # "us_dollars": a spelling of two words
            UNITS[_spelling] = (*UNITS.get(_spelling, ()), (_quantity, _factor, 0.0))
for _spellings, _scale in _TEMPERATURE.items():
    _readings = [("temperature", *_scale)] if _scale else [("temperature", *s) for s in _TEMPERATURE.values() if s]
    for _spelling in _spellings.split():
        _spelling = _spelling.replace("_", " ")
        UNITS[_spelling] = (*UNITS.get(_spelling, ()), *_readings)
# "$5" and "5 dollars" are the same money; a few money words are written before the number too ("USD 5")
_CURRENCY_BEFORE = r"(?:us\$|c\$|a\$|au\$|r\$|\$|€|£|¥|₹|₩|₽|usd|eur|gbp|jpy|inr|cny|rmb|chf|cad|aud|rs\.?)"
_UNIT = "|".join(re.escape(u).replace(r"\ ", r"\s+") for u in sorted(UNITS, key=len, reverse=True))
_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:e[+-]?\d+)?(?:/\d+(?![\d/]))?"
_NUMBER_AT = re.compile(rf"(?<![\w.]){_NUMBER}")
_CURRENCY_ENDING = re.compile(rf"{_CURRENCY_BEFORE}\s?$")
_UNIT_AT = re.compile(rf"(?:\s?-\s?|\s?)(?P<unit>{_UNIT}|°\s?[cf])(?![\w/$])|\s+(?P<word>[a-z]+)")
# words that may follow a number without being its unit ("20 in total", "7 feet tall")
_NOT_UNITS = set("""and or nor to is are was were be been in on at of for by with from as than but so if then it its
that this which who what when where total exactly approximately about roughly around times plus minus tall long high
wide deep old away each per apiece more less fewer or so overall altogether only just all exact precisely give take
units unit the a an i you he she we they there here""".split())


@dataclass(frozen=True)
class Quantity:
    """A number as written (`value` exact, `places` the decimals written: its precision) with the readings of its
    unit (none: a bare number) or, for a reference like "8 legs", the noun counted."""

    value: Fraction
    places: int
    readings: tuple[tuple[str, float, float], ...] = ()
    noun: str = ""
    word: str = ""  # the word after a number without a unit ("20 apples"): another noun, maybe
    fraction: bool = False  # written as a fraction ("1/3")

    def matches(self, expected: Quantity) -> bool:
        """Whether this (the answer's) quantity is the expected one (the reference's). A bare number is read in the
        reference's unit ("7" for "7 ft"); a unit or noun the reference does not have never matches ("7 m", "20
        cents", "8 arms" for "8 legs"); the same quantity in another unit is converted, and an inexact conversion
        counts when it is right to the decimals written and within 2 % ("2.13 m" for "7 ft")."""
        other_word = bool(self.word) and self.word not in _NOT_UNITS
        if expected.noun:  # "8 legs": the number bare or with that noun, not with a unit or another noun ("8 arms")
            noun = expected.noun.split()[0]
            return not self.readings and not (other_word and _singular(self.word) != _singular(noun)) and \
                self.value == expected.value
        if expected.readings and not self.readings and other_word:
            return False  # "20 apples" for "$20"
        if not self.readings or not expected.readings:
            if self.value == expected.value:
                return True
            percent = [q for q in (self, expected) if q.readings and q.readings[0][0] == "percent"]
            if percent:  # "50%" and "0.5", "half" and "50%"
                bare = expected if percent[0] is self else self
                return percent[0].value / 100 == bare.value
            if self.fraction != expected.fraction:
                # 1/3 and 0.33: the decimal is the fraction rounded to the two or more places it writes
                fraction, decimal = (self, expected) if self.fraction else (expected, self)
                return decimal.places >= 2 and round(fraction.value, decimal.places) == decimal.value
            return False
        for quantity, factor, offset in self.readings:
            for other, other_factor, other_offset in expected.readings:
                if quantity != other:
                    continue
                if factor == other_factor and offset == other_offset:
                    if self.value == expected.value:
                        return True
                    continue
                # the reference in this answer's unit; the answer may have rounded it to the decimals it wrote
                target = ((float(expected.value) * other_factor + other_offset) - offset) / factor
                written = float(self.value)
                if math.isclose(written, target, rel_tol=1e-9, abs_tol=1e-12):
                    return True
                if abs(written - target) <= 0.5 * 10.0 ** -self.places + 1e-12 and \
                        abs(written - target) <= 0.02 * abs(target):
                    return True
        return False


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _places(number: str) -> int:
    mantissa, _, exponent = number.split("/")[0].partition("e")  # the numerator of "1.5e1/2" holds its precision
    decimals = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
    return decimals - int(exponent or 0)


def quantities(text: str) -> list[tuple[Quantity, tuple[int, int]]]:
    """Every number in a normalised text, with its unit or currency, and where it stands."""
    out = []
    for match in _NUMBER_AT.finditer(text):
        number = match.group(0)
        value = number_value(number)
        if value is None:
            continue
        start, end = match.span()
        readings, word = (), ""
        currency = _CURRENCY_ENDING.search(text, max(0, start - 4), start)
        if currency:
            start = currency.start()
            readings = UNITS.get(currency.group(0).strip().rstrip(".")) or ()
        after = _UNIT_AT.match(text, end)
        if after and after.group("unit"):
            spelling = _UNIT_SPACE.sub(" ", after.group("unit").strip().rstrip("."))
            readings = readings or UNITS.get(spelling.replace("° ", "°")) or UNITS.get(spelling + ".") or ()
            end = after.end("unit")
        elif after:
            word = after.group("word")
        out.append((Quantity(value, _places(number), readings, word=word, fraction="/" in number), (start, end)))
    return out


_UNIT_SPACE = re.compile(r"\s+")
_APPROXIMATE = {"about", "approximately", "around", "roughly", "circa", "some", "approx", "ca", "nearabouts"}


def reference_quantity(reference: str) -> Quantity | None:
    """A reference that is one quantity ("2000 g", "$5", "twenty-one", "8 legs", "about 100"), else None."""
    text = normalise(reference)
    found = quantities(text)
    if len(found) != 1:
        return None
    quantity, (start, end) = found[0]
    before = [t for t, _, _ in tokens(text[:start]) if t not in _APPROXIMATE]
    after = [t for t, _, _ in tokens(text[end:])]
    if before:
        return None
    if after and (quantity.readings or len(after) > 2 or any(t in _NOT_UNITS or t[0].isdigit() for t in after)):
        return None
    return Quantity(quantity.value, quantity.places, quantity.readings, noun=" ".join(after),
                    fraction=quantity.fraction)


# ---------------------------------------------------------------------------------------------- times and dates

_CLOCK = re.compile(r"\b([01]\d|2[0-3])([0-5]\d)\s*(hours|hrs)\b|"
                    r"\b(\d{1,2})(?:[:.](\d{2}))?\s*(?:(a\.?\s?m\b\.?|p\.?\s?m\b\.?)|(?:oclock\s+)?in the "
                    r"(morning|afternoon|evening|night)\b|(oclock|hours|h)\b)|\b(\d{1,2})[:.h](\d{2})\b(?![.,]\d)|"
                    r"\b(noon|midday|midnight)\b")


def clock_times(text: str) -> list[tuple[frozenset[int], tuple[int, int]]]:
    """Times of day in a normalised text as the minutes after midnight they may mean ("7:00": 7 am or 7 pm)."""
    out = []
    for match in _CLOCK.finditer(text):
        military_hour, military_minute, _, hour_text, minute_text, ampm, part, oclock, hour24, minute24, word = \
            match.groups()
        if military_hour:  # 1500 hours
            minutes = {int(military_hour) * 60 + int(military_minute)}
        elif word:
            minutes = {720} if word in ("noon", "midday") else {0}
        elif hour24 is not None:
            hour, minute = int(hour24), int(minute24)
            if hour > 23 or minute > 59 or hour <= 12 and match.group(0)[len(hour24)] == ".":
                continue  # 19.00 is a time, 0.25 and 6.30 are numbers
            minutes = {hour * 60 + minute} if hour > 12 or hour24.startswith("0") or hour == 0 else \
                {(hour % 12) * 60 + minute, (hour % 12 + 12) * 60 + minute}
        else:
            hour, minute = int(hour_text), int(minute_text or 0)
            if hour > 23 or minute > 59 or (oclock == "h" and minute_text is None) or \
                    (oclock == "hours" and minute_text is None):
                continue
            if ampm or part:
                if hour > 12:
                    continue
                evening = (ampm or "").startswith("p") or part in ("afternoon", "evening") or \
                    (part == "night" and hour >= 6)
                minutes = {((hour % 12) + (12 if evening else 0)) * 60 + minute}
            else:
                minutes = {(hour % 12) * 60 + minute, (hour % 12 + 12) * 60 + minute} if hour <= 12 else \
                    {hour * 60 + minute}
        out.append((frozenset(minutes), match.span()))
    return out


_MONTHS = {m: i for i, name in enumerate("january february march april may june july august september october "
                                         "november december".split(), 1) for m in (name, name[:3])} | {"sept": 9}
_MONTH = r"(?P<{}>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\b\.?"
_DATE_PATTERNS = [re.compile(p) for p in [
    r"\b" + _MONTH.format("m") + r"\s+(?P<d>\d{1,2})\b,?\s+(?P<y>\d{3,4})\b",
    r"\b(?P<d>\d{1,2})\s+(?:of\s+)?" + _MONTH.format("m") + r",?\s+(?P<y>\d{3,4})\b",
    r"\b(?P<y>\d{4})[-–/.](?P<mn>\d{1,2})[-–/.](?P<d>\d{1,2})\b",
    r"\b(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<y>\d{4})\b",
    r"\b" + _MONTH.format("m") + r",?\s+(?P<y>\d{4})\b",
    r"\b" + _MONTH.format("m") + r"\s+(?P<d>\d{1,2})\b(?![,.]?\s*\d)",
    r"\b(?P<d>\d{1,2})\s+(?:of\s+)?" + _MONTH.format("m") + r"(?!,?\s*\d)",
]]


def dates(text: str) -> list[tuple[frozenset[tuple], tuple[int, int]]]:
    """Dates in a normalised text as the (year, month, day) they may mean (None: not written), and where."""
    out: list[tuple[frozenset[tuple], tuple[int, int]]] = []
    taken: list[tuple[int, int]] = []
    for pattern in _DATE_PATTERNS:
        for match in pattern.finditer(text):
            if any(s < match.end() and match.start() < e for s, e in taken):
                continue
            groups = match.groupdict()
            year = int(groups["y"]) if groups.get("y") else None
            if groups.get("a"):  # 04/05/2020: either order, unless one of them cannot be a month
                a, b = int(groups["a"]), int(groups["b"])
                readings = {(year, m, d) for m, d in ((a, b), (b, a)) if 1 <= m <= 12 and 1 <= d <= 31}
            else:
                month = _MONTHS[groups["m"]] if groups.get("m") else int(groups["mn"])
                day = int(groups["d"]) if groups.get("d") else None
                if groups.get("m") == "may" and day is None and year is None:
                    continue
                readings = {(year, month, day)} if 1 <= month <= 12 and (day is None or 1 <= day <= 31) else set()
            if readings:
                out.append((frozenset(readings), match.span()))
                taken.append(match.span())
    return out


def _date_matches(found: frozenset[tuple], expected: frozenset[tuple]) -> bool:
    """Every part the reference writes is there and the same ("July 1969" lacks the day of "July 20, 1969")."""
    return any(all(e is None or e == f for e, f in zip(want, have, strict=True))
               for want in expected for have in found)


# ---------------------------------------------------------------------------------------------------- hedges

_UNSURE = re.compile(r"\b(?:not sure|unsure|dont know|do not know|no idea|maybe|perhaps|possibly|uncertain|"
                     r"not certain|could be|might be|may be|hard to say|difficult to say|cannot say|cant say|"
                     r"cannot tell|cant tell|i guess)\b")
_NEGATIONS = {"not", "isnt", "arent", "wasnt", "werent", "doesnt", "dont", "didnt", "cannot", "cant", "wont",
              "never", "neither", "nor", "no", "hardly", "except", "excluding", "instead", "rather", "besides",
              "hasnt", "havent", "hadnt", "shouldnt", "couldnt", "wouldnt", "aint", "nothing"}
_BOUNDS = re.compile(r"(?:\b(?:more|less|fewer|greater|higher|lower|larger|smaller|bigger|longer|shorter|older|"
                     r"younger|earlier|later|other)\s+than|\bat\s+(?:least|most)|\bup\s+to|\bover|\bunder|\babove|"
                     r"\bbelow|\bnearly|\balmost|\bbetween|\bexceeding|\bupwards\s+of|\bbeyond|"
                     r"\bno\s+more\s+than|\bbefore|\bafter|\bsince|\buntil|\btill|[<>≤≥~]=?\s*(?=$)|\bexcept)"
                     r"\s*$")
_AFTER_BOUND = re.compile(r"^\s*(?:\+|or\s+(?:more|less|fewer|above|below|higher|lower|over|under|greater|later|"
                          r"earlier)\b|and\s+(?:up|above|over|more|below|under)\b|plus\b|at\s+(?:least|most)\b|"
                          r"or\s+so\b(?P<approximate>)|(?:(?:is|was|would\s+be)\s+(?:not|wrong|incorrect)|isnt|wasnt)"
                          r"\s*(?:$|right|correct|it\b|the\s+(?:right\s+|correct\s+)?answer))")
_SENTENCE = re.compile(r"[.;!?:\n](?:\s|$)|\bbut\b|\bhowever\b|\bactually\b|\binstead\b(?=\s*[,:])")
_CLAUSE = re.compile(r",\s|\s[–—-]\s|\(|\)")
_PRONOUNS = {"it", "its", "he", "she", "they", "this", "that", "i", "we", "you", "his", "her", "their", "which",
             "who", "there", "is", "was", "has", "had", "so", "then", "also", "not"}


def unsure(answer: str) -> bool:
    """The answer does not commit: "maybe", "not sure", "either", a question back."""
    return bool(_UNSURE.search(answer))


# Countries and states that close a place written from small to large ("Paris, Ile-de-France, France"): such an
# answer is one place, not a list of candidates.
_REGIONS = frozenset(normalise(name) for name in """United States|United Kingdom|England|Scotland|Wales|Ireland|
Northern Ireland|Canada|Mexico|Brazil|Argentina|Chile|Peru|Colombia|Venezuela|France|Germany|Italy|Spain|Portugal|
Netherlands|Belgium|Switzerland|Austria|Poland|Czech Republic|Czechia|Hungary|Greece|Turkey|Sweden|Norway|Denmark|
Finland|Iceland|Russia|Ukraine|Romania|Bulgaria|Serbia|Croatia|China|Japan|South Korea|Korea|North Korea|India|
Pakistan|Bangladesh|Indonesia|Philippines|Vietnam|Thailand|Malaysia|Singapore|Australia|New Zealand|Egypt|Nigeria|
Kenya|South Africa|Ethiopia|Morocco|Algeria|Ghana|Tanzania|Israel|Iran|Iraq|Saudi Arabia|United Arab Emirates|
Europe|Asia|Africa|North America|South America|Oceania|Alabama|Alaska|Arizona|Arkansas|California|Colorado|
Connecticut|Delaware|Florida|Georgia|Hawaii|Idaho|Illinois|Indiana|Iowa|Kansas|Kentucky|Louisiana|Maine|Maryland|
Massachusetts|Michigan|Minnesota|Mississippi|Missouri|Montana|Nebraska|Nevada|New Hampshire|New Jersey|New Mexico|
New York|North Carolina|North Dakota|Ohio|Oklahoma|Oregon|Pennsylvania|Rhode Island|South Carolina|South Dakota|
Tennessee|Texas|Utah|Vermont|Virginia|Washington|West Virginia|Wisconsin|Wyoming|Ontario|Quebec|British Columbia|
Alberta|Bavaria""".replace("\n", "").split("|"))

_REACH = 300
# the patterns committed() reads with, compiled once
_WORDS_RE = re.compile(r"\w+")
_ALTERNATIVE_BEFORE = re.compile(r"(?:\b(?:or|nor|either|neither|vs|versus)|\d\s*to|[/–—&])\s*$")
_EXCEPT_BEFORE = re.compile(r"\b(?:anything|everything|all|nothing|any\s+\w+)\s+but\s*$")
_ALTERNATIVE_AFTER = re.compile(r"^\s*[,(]?\s*(?:[/–—&]|(?:or|nor|vs|versus)\b(?!\s+so\b)|to\s+[-$€£¥\d])")
_QUESTION_AFTER = re.compile(r"\s*\?")
_NUMBER_BEFORE = re.compile(r"\d\s+$")
_NUMBER_AFTER = re.compile(r"^\s+-?\d")
_OR_WORD = re.compile(r"\b(?:or|nor)\s+\S")
_AND_BEFORE = re.compile(r"(?:^|\s)and\s*$")
_AND_AFTER = re.compile(r"^\s*(?:,\s*)?and\s+(\w+)")
_COMMA = re.compile(r"\s*,\s*")
_COMMA_BEFORE = re.compile(r",\s*$")
_COMMA_AFTER = re.compile(r"^\s*,")
_ITEM_SEPARATOR = re.compile(r"\s*(?:[,;/\n?!]|(?<!\d)\.(?!\d)|\b(?:and|or)\b)\s*")


def committed(text: str, start: int, end: int, numeric: bool = False) -> bool:
    """Whether the answer commits to what stands at text[start:end]: it is not negated, one of several candidates
    or (`numeric`: a number, date or time) bounded or one end of a range. `text` is normalised."""
    # the sentence around it, at most _REACH characters each side: a long answer with many matches stays linear
    low, high = max(0, start - _REACH), min(len(text), end + _REACH)
    sentence_start = max((m.end() for m in _SENTENCE.finditer(text, low, start)), default=low)
    sentence_end = next((m.start() for m in _SENTENCE.finditer(text, end, high)), high)
    before, after = text[sentence_start:start], text[end:sentence_end]
    clause = before[max((m.end() for m in _CLAUSE.finditer(before)), default=0):]
    tail = before[-40:]  # the patterns that end where the match starts read only this far back
    if _EXCEPT_BEFORE.search(text[max(low, start - 40):start]):  # across the sentence's "but"
        return False  # "anything but Paris"
    if any(w in _NEGATIONS for w in _WORDS_RE.findall(clause)):
        return False  # "not Paris", "Lyon, not Paris", "I dont think it is Paris"
    if numeric and _BOUNDS.search(tail):
        return False  # "more than 100", "between 6 and 10"
    bound = _AFTER_BOUND.match(after)
    if bound and bound.group("approximate") is None and (numeric or bound.group(0).strip()[:1] not in "+ap"):
        return False  # "100+", "100 or more", "Paris is not the answer"
    if _ALTERNATIVE_BEFORE.search(tail):
        return False  # "6 or 8", "either 6 or 8", "Paris/Lyon", "6–8", "6 to 8"
    if _ALTERNATIVE_AFTER.match(after):
        return False  # "8 or 10", "6–8", "Paris/Lyon", "9, 10, or 11"
    if _QUESTION_AFTER.match(text, end):
        return False  # "Canada? Mexico?"
    if numeric and (_NUMBER_BEFORE.search(tail) or _NUMBER_AFTER.match(after)):
        return False  # "4 5", "1 2 3 4 5"
    or_word = _OR_WORD.search(after) if _COMMA_AFTER.match(after) else None
    if or_word and all(len(item.split()) <= 3 for item in after[:or_word.start()].split(",")):
        return False  # "6, 8 or 10", "Jupiter, Saturn, Uranus or Neptune"
    if _AND_BEFORE.search(tail) and len(_WORDS_RE.findall(before)) <= 4:
        return False  # "Marlowe and Shakespeare"
    following = _AND_AFTER.match(after)
    if following and following.group(1) not in _PRONOUNS and len(_WORDS_RE.findall(after)) <= 4:
        return False  # "Paris and Lyon", "4 and 5"
    # a bare comma list of three or more short items that is the whole sentence: "Paris, Lyon, Marseille"
    others = (_COMMA.split(before.strip()) if _COMMA_BEFORE.search(before) else []) + \
        (_COMMA.split(after.strip()) if _COMMA_AFTER.match(after) else [])
    others = [i for i in others if i and not _NEGATIONS & set(_WORDS_RE.findall(i))]  # "Paris, not Lyon" is one
    last = others[-1].strip(" .!") if others else ""
    place = last in _REGIONS and text[start:end] not in _REGIONS  # "New York City, New York, USA" is one place
    if len(others) >= 2 and all(len(i.split()) <= 3 for i in others) and not place:
        return False
    # an answer that is nothing but short items, one per line or sentence: "Paris. Lyon. Nice." lists candidates
    if len(text) > 200:
        return True
    rest = text[:start] + " \0 " + text[end:]
    items = [i for i in _ITEM_SEPARATOR.split(rest)
             if i.strip() and not _NEGATIONS & set(_WORDS_RE.findall(i))]
    place = place or items and items[-1].strip(" .!") in _REGIONS and text[start:end] not in _REGIONS
    return place or not (len(items) >= 3 and all(len(i.split()) <= 3 for i in items) and len(rest.split()) <= 12)


# ---------------------------------------------------------------------------------------------------- yes / no

# Yes / no answers are read for their polarity, not their words: "not yes" is no, "it is not" is no.
_YES = {"yes", "yeah", "yep", "yup", "yea", "aye", "true", "correct", "right", "affirmative", "indeed", "sure"}
_NO = {"no", "nope", "nah", "false", "incorrect", "wrong", "negative"}
_EMPHASIS = {"definitely", "certainly", "absolutely", "surely", "course", "totally", "obviously"}  # "definitely not"
_NEGATION = {"not", "isnt", "arent", "wasnt", "werent", "doesnt", "dont", "didnt", "cannot", "cant", "wont",
             "never", "hasnt", "havent", "hadnt", "shouldnt", "couldnt", "wouldnt", "neither", "nor", "none"}
_UNSURE_POLARITY = re.compile(r"\b(?:not sure|unsure|dont know|do not know|no idea|maybe|perhaps|possibly|"
                              r"uncertain|unclear|cannot (?:tell|say|be sure)|cant (?:tell|say|be sure)|depends|"
                              r"not certain|hard to say|difficult to say)\b")
_PRONOUN = {"it", "they", "he", "she", "i", "we", "you", "that", "this", "there"}
_AUXILIARY = {"is", "are", "was", "were", "does", "do", "did", "can", "will", "has", "have", "had", "should",
              "would", "could", "must", "its", "thats", "theres"}


def polarity(text: str) -> bool | None:
    """True for a yes, False for a no, None for neither or both ('maybe', 'yes and no', a bare statement)."""
    words = qa_tokens(text)
    if not words or _UNSURE_POLARITY.search(" ".join(words)):
        return None
    for i, token in enumerate(words):
        before = words[i - 1] if i else ""
        after = words[i + 1] if i + 1 < len(words) else ""
        if token in _YES or token in _NO:
            if after in ("and", "or") and i + 2 < len(words) and words[i + 2] in (_NO if token in _YES else _YES):
                return None  # "yes and no", "yes or no"
            answer = token in _YES
            return (not answer) if before in _NEGATION else answer
        if token in _EMPHASIS:
            return after not in _NEGATION
    if any(t in _NEGATION for t in words):
        return False
    if words[-2:] in (["think", "so"], ["believe", "so"], ["guess", "so"], ["hope", "so"]):
        return True  # "I think so"
    # a short affirmation without yes: "it is", "they do", "that's right" (a longer statement is not read)
    if len(words) <= 4 and (words[0] in _PRONOUN and len(words) > 1 and words[1] in _AUXILIARY
                            or words[0] in ("its", "thats", "theres")):
        return True
    return None


# ---------------------------------------------------------------------------------------------------- scoring

_QA_TOKEN = re.compile(r"(?<![\w.])-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)|\w+")
_NUMBER_WORDS = {w: str(i) for w, i in _SMALL.items() if i <= 20} | {"twenty": "20"}


def _canonical_number(token: str) -> str | None:
    """'1,000' -> '1000', '3.50' -> '3.5', '.5' -> '0.5': one spelling per number, so numbers compare as numbers."""
    from decimal import Decimal, InvalidOperation

    try:
        value = Decimal(token.replace(",", ""))
    except InvalidOperation:
        return None
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "") else text


def qa_tokens(text: str) -> list[str]:
    """SQuAD's answer normalisation as tokens (token F1 of long answers, yes / no): lower case, punctuation and the
    articles a / an / the dropped, apostrophes joined ("Kenya's" -> "kenyas"), every number in one spelling
    ('1,000' = '1000', '3.50' = '3.5', 'three' = '3', 'twenty-one' = '21', 'a hundred' = '100', '1k' = '1000').
    Unicode words (Korean, accents) are kept as they are."""
    out = []
    for token in _QA_TOKEN.findall(spell_numbers(text.lower().replace("'", "").replace("\u2019", ""))):
        if token[0].isdigit() or token[0] in "-.":
            token = _canonical_number(token) or token
        token = _NUMBER_WORDS.get(token, token)
        if token not in _ARTICLES:
            out.append(token)
    return out


@functools.lru_cache(maxsize=4096)
def reference_words(reference: str) -> tuple[str, ...]:
    """qa_tokens of a reference, kept: a group of completions shares one."""
    return tuple(qa_tokens(reference))


def qa_f1(predicted: list[str], reference: list[str]) -> float:
    """SQuAD's token F1 (multiset overlap of normalised tokens)."""
    from collections import Counter

    common = Counter(predicted) & Counter(reference)
    overlap = sum(common.values())
    if not overlap:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(reference)
    return 2 * precision * recall / (precision + recall)


_NO_COUNT = re.compile(r"\bno\s+(?!(?:more|less|fewer|longer|later|earlier|idea|way|doubt|one|other)\b)(?=[a-z])")


@functools.lru_cache(maxsize=1024)
def reference_kind(reference: str) -> tuple:
    """What kind of answer a reference asks for: ("date" | "time" | "quantity" | "text", what is expected)."""
    text = normalise(reference)
    words = tokens(text)
    # a reference that is itself a range or a bound ("100+", "after 1945") is read as words, so it still scores itself
    for kind, found in (("date", dates(text)), ("time", clock_times(text))):
        if len(found) == 1:
            start, end = found[0][1]
            if not [t for t, s, e in words if e <= start or s >= end] and committed(text, start, end, numeric=True):
                return kind, found[0][0]
    quantity = reference_quantity(reference)
    if quantity is not None and all(committed(text, s, e, numeric=True) for _, (s, e) in quantities(text)):
        return "quantity", quantity
    return "text", tuple(t for t, _, _ in words)


_FUNCTION_WORDS = {"is", "was", "are", "were", "the", "a", "an", "of", "in", "on", "by", "it", "its", "and", "to",
                   "for", "with", "from", "as", "at", "which", "who", "that", "this", "i", "answer", "be"}


_PUNCTUATION = re.compile(r"[,;:()]")


def _bag_of_names(answer: str, reference_words: int) -> bool:
    """A short answer of capitalised words and nothing else, three or more beyond the reference: "Paris Lyon
    Marseille Nice" names candidates without a comma."""
    if _PUNCTUATION.search(answer):
        return False  # "Austin, Texas, United States" is one place written out; commas are read by committed()
    words = _WORDS_RE.findall(answer)
    return len(words) - reference_words >= 3 and len(words) <= 8 and \
        all(w[0].isupper() or w[0].isdigit() for w in words) and not _FUNCTION_WORDS & {w.lower() for w in words}


# matches looked at in one answer: one that names the reference this often without committing does not commit
_MOST_MATCHES = 50


def read_answer(answer: str, reference: str, contains: bool = True, short_answer_words: int = 5) -> float:
    """The score of a model's answer against one reference (not yes / no): 1.0 when the answer commits to the
    reference's date, time of day, quantity or words (anywhere, with `contains`; else as the whole answer), 0.0
    when it does not or hedges; a text reference longer than `short_answer_words` words scores token F1."""
    kind, expected = reference_kind(reference)
    plain = normalise(answer)
    if unsure(plain) and not unsure(normalise(reference)):  # a reference "maybe" is an answer, not a hedge
        return 0.0
    formula = _FORMULA_HINT.search(answer.translate(_SUBSCRIPT))
    variants = (plain, normalise(answer, formulas=True)) if formula else (plain,)
    for text in dict.fromkeys(variants):
        if kind == "quantity" and expected.value == 0:
            text = _NO_COUNT.sub("0 ", text)  # "Venus has no moons" for 0
        if kind == "date":
            found = [span for readings, span in dates(text) if _date_matches(readings, expected)]
        elif kind == "time":
            found = [span for minutes, span in clock_times(text) if minutes & expected]
        elif kind == "quantity":
            found = [span for quantity, span in quantities(text) if quantity.matches(expected)]
        else:
            spans = tokens(text)
            words = [t for t, _, _ in spans]
            n, first = len(expected), expected[0] if expected else None
            found = [(spans[i][1], spans[i + n - 1][2]) for i in range(len(words) - n + 1)
                     if words[i] == first and tuple(words[i:i + n]) == expected]
        numeric = kind != "text"
        if not numeric and _bag_of_names(answer, len(expected)):
            continue
        for start, end in found[:_MOST_MATCHES]:
            if not committed(text, start, end, numeric=numeric):
                continue
            allowed = _APPROXIMATE | set(expected.noun.split()) if kind == "quantity" else _APPROXIMATE
            if contains or not [t for t, s, e in tokens(text) if (e <= start or s >= end) and t not in allowed]:
                return 1.0
    if kind == "text" and len(expected) > short_answer_words:
        return qa_f1(qa_tokens(answer), qa_tokens(reference))
    return 0.0
