"""The prompt sets that drive self-distillation, built offline from templates.

`python -m pydflash2.train.prompts` rewrites pydflash2/data/prompts_train.txt
(>= 2,000 prompts) and prompts_dev.txt (held out: no prompt in common). Both are
one prompt per line, the format `pydflash2 bench --prompts` and `pydflash2
train --prompts` read. The sets are deterministic (fixed seed), so the files in
the repository are exactly what this script writes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TRAIN_FILE = DATA_DIR / "prompts_train.txt"
DEV_FILE = DATA_DIR / "prompts_dev.txt"

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "plate tectonics", "vaccines", "the immune system",
    "climate change", "renewable energy", "nuclear fission", "the French Revolution", "the Roman Empire",
    "the printing press", "the industrial revolution", "democracy", "inflation", "supply and demand",
    "compound interest", "machine learning", "neural networks", "the internet", "encryption", "blockchain",
    "quantum computing", "DNA", "evolution by natural selection", "gravity", "electricity", "magnetism",
    "the speed of light", "rainbows", "volcanoes", "earthquakes", "hurricanes", "the moon's phases",
    "the seasons", "sleep", "meditation", "nutrition", "exercise", "the human heart", "the brain",
    "bees and pollination", "coral reefs", "rainforests", "deserts", "recycling", "composting",
    "the stock market", "taxes", "budgeting", "public speaking", "time management", "learning a language",
    "chess", "football", "the Olympic Games", "jazz music", "classical music", "impressionist painting",
    "photography", "coffee", "bread baking", "fermentation", "the history of tea", "electric cars",
    "airplanes", "rockets", "the solar system", "Mars exploration", "satellites", "GPS", "smartphones",
    "social media", "video games", "open source software", "operating systems", "databases",
    "cloud computing", "cybersecurity", "password safety", "antibiotics", "the placebo effect",
    "probability", "prime numbers", "the Pythagorean theorem", "calculus", "statistics", "fractions",
    "the metric system", "maps and navigation", "languages of the world", "writing systems",
    "ancient Egypt", "the Silk Road", "the Renaissance", "the Cold War", "the moon landing",
    "volunteering", "gardening", "dogs as pets", "cats as pets", "bird migration", "whales", "octopuses",
]

AUDIENCES = ["a five-year-old", "a high school student", "a busy executive", "a beginner", "an expert",
             "my grandmother", "a curious teenager", "a new employee"]

EXPLAIN = [
    "Explain {t} to {a}.",
    "What is {t}? Answer in a few sentences.",
    "Give a short overview of {t}.",
    "Why is {t} important? Explain briefly.",
    "Describe {t} in simple terms for {a}.",
    "What are three interesting facts about {t}?",
    "What are the most common misconceptions about {t}?",
    "Summarize the key ideas of {t} in a short paragraph.",
    "How would you teach {t} to {a}?",
    "Write a quiz question about {t} and give the answer.",
]

FORMS = ["short story", "poem", "haiku", "limerick", "blog post introduction", "product description",
         "motivational speech", "news headline and first paragraph", "diary entry", "short dialogue"]
SUBJECTS = [
    "a robot learning to paint", "a cat who becomes mayor", "the first day of spring", "a lost key",
    "a lighthouse keeper", "a journey to the moon", "an old bookshop", "a rainy afternoon",
    "a dragon who is afraid of fire", "a time traveler at a train station", "friendship", "the ocean",
    "a city at night", "a small village bakery", "a forgotten letter", "winning a chess match",
    "a talking tree", "learning to ride a bike", "the last day of summer", "a mysterious map",
    "a detective who loves tea", "a garden on a spaceship", "a musician without an instrument",
    "an unexpected snowstorm", "two rival chefs", "a robot and a child", "a mountain climb",
]
WRITE = [
    "Write a {f} about {s}.",
    "Write a {f} about {s}. Keep it under 100 words.",
    "Can you write a {f} about {s}?",
    "Please write a funny {f} about {s}.",
]

ACTIVITIES = [
    "staying focused while studying", "a job interview", "saving money", "sleeping better", "cooking rice",
    "running a first marathon", "learning to code", "writing a resume", "keeping houseplants alive",
    "traveling on a budget", "making new friends in a new city", "reducing stress", "giving feedback",
    "starting a small business", "writing clean code", "taking better photos", "organizing a desk",
    "learning to play guitar", "preparing for an exam", "eating healthier", "staying hydrated",
    "working from home", "planning a birthday party", "reading more books", "public speaking",
]
LISTS = [
    "Give me {n} tips for {x}.",
    "List {n} mistakes people make when {x2}.",
    "What are {n} good habits for {x}?",
    "Make a checklist for {x}.",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "sorts a list of numbers with bubble sort", "counts the vowels in a string",
    "finds the largest element of a list", "removes duplicates from a list", "checks whether a word is a palindrome",
    "computes the factorial of n", "converts Celsius to Fahrenheit", "merges two sorted lists",
    "computes the greatest common divisor of two numbers", "reads a text file and counts its lines",
    "flattens a nested list", "returns the sum of the digits of a number", "capitalizes every word in a sentence",
    "implements binary search", "checks whether two strings are anagrams", "computes the average of a list",
    "finds the second largest number in a list", "converts a decimal number to binary",
    "counts word frequencies in a text", "validates an email address with a simple rule",
    "transposes a matrix", "generates all permutations of a string", "rotates a list by k positions",
    "checks whether parentheses in a string are balanced", "returns the intersection of two lists",
    "computes the power set of a set", "implements a stack with push and pop",
]
LANGUAGES = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "TypeScript", "C++"]
CODE = [
    "Write a {l} function that {c}.",
    "How do I write a function in {l} that {c}? Show the code.",
    "Write a {l} function that {c}, with a short explanation.",
    "Write a {l} function that {c} and a test for it.",
]
CODE_EXTRA = [
    "Explain what a {w} is in programming, with an example in {l}.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that selects the ten most recent orders from a table called orders.",
    "Write a bash command that counts the files in a directory.",
    "How do I read a JSON file in {l}?",
    "Explain recursion with a simple {l} example.",
    "What does the {w} keyword do in {l}?",
]
CODE_WORDS = ["class", "closure", "pointer", "iterator", "generator", "interface", "hash map", "linked list",
              "lambda", "exception", "thread", "module"]

COMPARE_PAIRS = [
    ("a virus", "a bacterium"), ("weather", "climate"), ("a lake", "a pond"), ("RAM", "storage"),
    ("a crocodile", "an alligator"), ("speed", "velocity"), ("mass", "weight"), ("a comet", "an asteroid"),
    ("Python", "JavaScript"), ("stocks", "bonds"), ("a simile", "a metaphor"), ("baking soda", "baking powder"),
    ("a tornado", "a hurricane"), ("HTTP", "HTTPS"), ("a democracy", "a republic"), ("tea", "coffee"),
    ("a frog", "a toad"), ("AC", "DC current"), ("an atom", "a molecule"), ("a CPU", "a GPU"),
]
COMPARE = ["What is the difference between {x} and {y}?", "Compare {x} and {y} in a short table.",
           "Is {x} the same as {y}? Explain."]

SENTENCES = [
    "the meeting was moved to next tuesday because the manager is sick",
    "I can't come to the party tonight, sorry",
    "The weather is nice today, so we are going to the park.",
    "Our new product helps people save time every day.",
    "Please send me the report before Friday.",
    "The cat sat on the warm windowsill and watched the birds.",
    "We have received your order and will ship it soon.",
    "Learning a new language takes patience and practice.",
    "The train was late again this morning.",
    "Thank you for your help with the project.",
]
REWRITE = [
    "Rewrite this sentence more formally: \"{s}\"",
    "Translate into French: \"{s}\"",
    "Translate into Spanish: \"{s}\"",
    "Fix the grammar and punctuation: \"{s}\"",
    "Make this sentence sound more friendly: \"{s}\"",
    "Summarize in five words: \"{s}\"",
]

CHAT = [
    "Hi! How are you today?", "Can you tell me a joke?", "What should I cook for dinner tonight?",
    "I feel a bit tired today. Any advice?", "What is your favorite book and why?",
    "Can you recommend a good movie for a rainy day?", "Tell me something interesting.",
    "I'm bored. What can I do?", "Good morning! What's a good way to start the day?",
    "Can you help me plan a weekend trip?", "What is the meaning of life?",
    "Do you think robots will replace teachers?", "How do I stay motivated?",
    "What's a fun fact about space?", "Help me name my new puppy.",
    "What are some good questions to ask on a first date?", "Can you suggest a hobby for me?",
    "I have an exam tomorrow and I'm nervous.", "What is a good gift for my dad?",
    "How can I be more productive in the morning?",
]
CHAT_T = ["Can you recommend a book about {t}?", "I want to learn about {t}. Where should I start?",
          "Tell me a fun fact about {t}.", "What is a good question to ask an expert on {t}?"]
INGREDIENTS = ["eggs", "rice", "tomatoes", "chicken", "potatoes", "spinach", "cheese", "beans", "pasta",
               "mushrooms", "onions", "carrots", "tofu", "lemons"]


def _maths(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    kind = rng.randrange(10)
    if kind == 0:
        return f"What is {a} + {b}?"
    if kind == 1:
        return f"What is {a} times {c}? Show your work."
    if kind == 2:
        return f"Solve for x: {c}x + {a} = {a + c * b}."
    if kind == 3:
        return f"A train travels {a * c} km in {c} hours. What is its average speed?"
    if kind == 4:
        return f"If I have {a} apples and give away {min(a, b)}, how many are left?"
    if kind == 5:
        return f"What is {c}% of {a * 10}?"
    if kind == 6:
        return f"A rectangle is {a} cm long and {c} cm wide. What are its area and perimeter?"
    if kind == 7:
        return f"Is {a * 2 + 1} a prime number? Explain."
    if kind == 8:
        return f"Convert {a} kilometers to miles."
    return f"A shirt costs ${a} and is {c * 5 % 60 + 10}% off. What is the sale price?"


def _stories(rng: random.Random, subjects: list[str]) -> list[str]:
    return [rng.choice(WRITE).format(f=f, s=s) for s in subjects for f in rng.sample(FORMS, 8)]


def _checklists(rng: random.Random, activities: list[str]) -> list[str]:
    out = []
    for x in activities:
        for tpl in LISTS:
            x2 = x if tpl != LISTS[1] else x.replace("a ", "", 1)  # "mistakes people make when [a] ..."
            out.append(tpl.format(n=rng.choice([3, 4, 5, 7, 10]), x=x, x2=x2))
    return out


def _comparisons(pairs: list[tuple[str, str]]) -> list[str]:
    return [tpl.format(x=x, y=y) for x, y in pairs for tpl in COMPARE]


def _code_prompts(rng: random.Random, n_languages: int) -> list[str]:
    return [rng.choice(CODE).format(l=lang, c=c) for c in CODE_TASKS for lang in rng.sample(LANGUAGES, n_languages)]


def _distinct_shuffled(rng: random.Random, pool: list[str]) -> list[str]:
    pool = list(dict.fromkeys(pool))  # distinct, first occurrence kept
    rng.shuffle(pool)
    return pool


def build_pool(seed: int = 0) -> list[str]:
    """Every distinct prompt the templates make, in a fixed shuffled order."""
    rng = random.Random(seed)
    pool: list[str] = []
    for t in TOPICS:
        for tpl in rng.sample(EXPLAIN, 8):
            pool.append(tpl.format(t=t, a=rng.choice(AUDIENCES)))
        pool.append(rng.choice(CHAT_T).format(t=t))
    pool += _stories(rng, SUBJECTS)
    pool += _checklists(rng, ACTIVITIES)
    pool += _code_prompts(rng, 6)
    for w in CODE_WORDS:
        for lang in rng.sample(LANGUAGES, 2):
            pool.append(rng.choice(CODE_EXTRA).format(w=w, l=lang))
    pool += _comparisons(COMPARE_PAIRS)
    for s in SENTENCES:
        for tpl in REWRITE:
            pool.append(tpl.format(s=s))
    pool += CHAT
    for _ in range(60):
        a, b = rng.sample(INGREDIENTS, 2)
        pool.append(f"What can I cook with {a} and {b}?")
    pool += [_maths(rng) for _ in range(600)]
    return _distinct_shuffled(rng, pool)


# A second batch, appended after the first so that a dataset distilled from the first keeps
# its prompt indices (distillation resumes by index): new topics, subjects, activities and
# pairs through the same templates, new question forms for every topic, and more arithmetic.
MORE_TOPICS = [
    "glaciers", "tides", "the ozone layer", "acid rain", "wind power", "solar panels", "batteries",
    "semiconductors", "lasers", "radio waves", "sound waves", "optics", "thermodynamics", "friction",
    "buoyancy", "atoms", "the periodic table", "chemical reactions", "acids and bases", "proteins",
    "enzymes", "cells", "bacteria", "viruses", "the nervous system", "the digestive system", "the lungs",
    "blood types", "genetics", "memory", "emotions", "habits", "motivation", "creativity", "critical thinking",
    "negotiation", "leadership", "teamwork", "project management", "marketing", "advertising", "branding",
    "entrepreneurship", "banking", "credit scores", "insurance", "retirement savings", "cryptocurrency",
    "globalization", "trade", "urban planning", "public transport", "architecture", "bridges", "skyscrapers",
    "the Great Wall of China", "the pyramids", "ancient Greece", "the Vikings", "the Aztecs", "the Ming dynasty",
    "the Ottoman Empire", "World War I", "World War II", "the civil rights movement", "the Industrial Age",
    "the space race", "the United Nations", "human rights", "free speech", "elections", "philosophy",
    "ethics", "logic", "Stoicism", "Buddhism", "mythology", "Shakespeare", "poetry", "the novel",
    "film making", "animation", "theater", "opera", "rock music", "hip hop", "ballet", "sculpture",
    "pottery", "knitting", "woodworking", "camping", "hiking", "cycling", "swimming", "yoga", "tennis",
    "basketball", "marathon running", "mountaineering", "astronomy", "telescopes", "the Milky Way",
    "exoplanets", "the Big Bang", "dark matter", "comets", "the sun", "weather forecasting", "clouds",
    "lightning", "rivers", "forests", "wetlands", "endangered species", "penguins", "elephants", "ants",
    "spiders", "sharks", "dinosaurs", "fossils", "robots", "self-driving cars", "3D printing",
    "virtual reality", "artificial intelligence", "computer vision", "speech recognition", "search engines",
    "web browsers", "email", "programming languages", "algorithms", "data structures", "compilers",
    "version control", "unit testing", "APIs", "spreadsheets", "data privacy", "online learning",
]
MORE_EXPLAIN = [
    "What are the pros and cons of {t}?",
    "Write a short paragraph about {t} for a school newsletter.",
    "What should everyone know about {t}?",
    "Explain the history of {t} in a few sentences.",
    "How does {t} affect everyday life?",
    "Give an example that helps {a} understand {t}.",
]
MORE_SUBJECTS = [
    "a penguin who wants to fly", "a haunted library", "a robot chef", "a treasure hunt in the city",
    "a friendly ghost", "a kite festival", "the first snow of winter", "a lonely astronaut",
    "a squirrel planning for winter", "a magic umbrella", "a long train journey", "a village by the sea",
    "a broken clock", "a secret garden", "a street musician", "a shy dragon", "a new neighbor",
    "a bicycle that can talk", "a storm at sea", "an old photograph", "a birthday surprise",
    "a fox and a crow", "a library at midnight", "a child's first drawing", "a desert island",
    "a city of robots", "a wise old owl", "a missing sock", "a race between snails", "a midnight picnic",
]
MORE_ACTIVITIES = [
    "learning to cook", "moving to a new apartment", "training a puppy", "writing a novel", "learning to swim",
    "growing tomatoes", "negotiating a salary", "studying for a math test", "making a website",
    "choosing a laptop", "cleaning the kitchen", "waking up early", "learning to draw", "starting a podcast",
    "packing for a trip", "running a meeting", "writing an email to a professor", "staying safe online",
]
MORE_PAIRS = [
    ("a violin", "a viola"), ("a rabbit", "a hare"), ("a sea", "an ocean"), ("a hill", "a mountain"),
    ("fission", "fusion"), ("a list", "a set"), ("TCP", "UDP"), ("a compiler", "an interpreter"),
    ("a cold", "the flu"), ("a loan", "a grant"), ("a moth", "a butterfly"), ("a star", "a planet"),
    ("Linux", "Windows"), ("jam", "jelly"), ("a cyclone", "a typhoon"), ("an emu", "an ostrich"),
]


def build_extra_pool(seed: int = 0) -> list[str]:
    """The second batch: every distinct prompt of the new lists, in a fixed shuffled order."""
    rng = random.Random(seed + 1)
    pool: list[str] = []
    for t in MORE_TOPICS:
        for tpl in rng.sample(EXPLAIN, 6) + rng.sample(MORE_EXPLAIN, 2):
            pool.append(tpl.format(t=t, a=rng.choice(AUDIENCES)))
        pool.append(rng.choice(CHAT_T).format(t=t))
    for t in TOPICS:
        for tpl in rng.sample(MORE_EXPLAIN, 3):
            pool.append(tpl.format(t=t, a=rng.choice(AUDIENCES)))
    pool += _stories(rng, MORE_SUBJECTS)
    pool += _checklists(rng, MORE_ACTIVITIES)
    pool += _comparisons(MORE_PAIRS)
    pool += _code_prompts(rng, 3)
    pool += [_maths(rng) for _ in range(500)]
    return _distinct_shuffled(rng, pool)


def split(pool: list[str], n_dev: int) -> tuple[list[str], list[str]]:
    """(train, dev): the first n_dev prompts are held out."""
    return pool[n_dev:], pool[:n_dev]


def as_messages(prompt: str) -> list[dict[str, str]]:
    """The chat messages of one prompt line: a JSON list of {"role", "content"} (a multi-turn
    conversation ending in a user turn) or, for any other line, one user message."""
    if prompt.startswith('[{"role"'):
        try:
            msgs = json.loads(prompt)
        except ValueError:
            msgs = None
        if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and {"role", "content"} <= m.keys()
                                                   for m in msgs):
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs]
    return [{"role": "user", "content": prompt}]


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per non-empty line."""
    return [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pydflash2.train.prompts", description=__doc__.split("\n\n")[0])
    p.add_argument("--dev", type=int, default=64, help="held-out dev prompts (default 64)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train, dev = split(build_pool(args.seed), args.dev)
    seen = set(train) | set(dev)
    train += [q for q in build_extra_pool(args.seed) if q not in seen]  # appended: old indices stay
    TRAIN_FILE.write_text("\n".join(train) + "\n", encoding="utf-8")
    DEV_FILE.write_text("\n".join(dev) + "\n", encoding="utf-8")
    print(f"wrote {len(train)} prompts to {TRAIN_FILE} and {len(dev)} to {DEV_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
