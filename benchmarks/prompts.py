"""The fixed workloads: short, varied chat prompts, so every target answers the same questions;
quote prompts, whose answers repeat a passage or a function of the prompt with one edit (what n-gram
speculative decoding is for); and long random system prompts for the prefix-cache scenario."""

import random

PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis in two sentences.",
    "Give me three tips for a good night's sleep.",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish, French and German.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Name five fruits that are red.",
    "Summarize the plot of Romeo and Juliet.",
    "What does HTTP stand for?",
    "Describe a cat to someone who has never seen one.",
    "List the planets of the solar system in order.",
    "How do I boil an egg?",
    "Write a short poem about the sea.",
    "What is the difference between weather and climate?",
    "Suggest a name for a coffee shop.",
    "Explain what a prime number is.",
    "Give an example of a metaphor.",
    "What causes the seasons on Earth?",
    "Write a limerick about a programmer.",
    "How many legs does a spider have?",
    "What is the boiling point of water in Fahrenheit?",
    "Recommend a hobby for a rainy day.",
    "Explain recursion to a child.",
    "What is the largest ocean on Earth?",
    "Write a two-line story about a robot.",
    "What are the primary colors?",
    "How does a rainbow form?",
    "Give me a simple recipe for pancakes.",
    "What is the square root of 144?",
    "Describe the taste of a lemon.",
    "Who wrote Hamlet?",
    "Explain what a database index is.",
    "List three benefits of regular exercise.",
    "What is the opposite of 'generous'?",
    "Write a thank-you note to a teacher.",
    "How do bees make honey?",
    "What is an API?",
    "Give me a fun fact about octopuses.",
    "Explain the water cycle.",
    "What is the tallest mountain in the world?",
    "Write a SQL query that counts rows in a table named users.",
    "What should I pack for a beach trip?",
    "Define the word 'ephemeral'.",
    "How does a compass work?",
    "Tell me a joke about vegetables.",
    "What is the speed of light?",
    "Explain the rules of tic-tac-toe.",
    "Write a motivational sentence for a Monday.",
    "What language is spoken in Brazil?",
    "Describe the sound of rain.",
    "What is machine learning, briefly?",
    "Convert 10 kilometers to miles.",
    "Name three famous painters.",
    "How do plants drink water?",
    "Write a short product description for a water bottle.",
    "What is the freezing point of water in Celsius?",
    "Give two reasons to learn a second language.",
    "Explain what a black hole is.",
    "What is the plural of 'mouse'?",
    "Write a riddle and give its answer.",
    "How many minutes are in a day?",
    "Describe your ideal weekend in three sentences.",
)

_PASSAGES: tuple[str, ...] = (
    "The lighthouse stood at the edge of the cliff, its white paint peeling in long strips. Every night the keeper "
    "climbed the spiral stairs, lit the great lamp, and watched the beam sweep across the dark water. Ships passed "
    "far out at sea, their lights small and steady, and none of them knew his name. In winter the storms came "
    "from the north and rattled the windows until dawn, and the keeper wrote in his log by candlelight: the wind, "
    "the waves, the ships he had seen, and the ones he had only heard.",
    "Our office is open from Monday to Friday, nine in the morning to five in the afternoon. Visitors should sign "
    "in at the front desk and wear the badge they are given at all times. Parking is available behind the "
    "building; please do not park in the spaces marked for deliveries. If you need help during your visit, ask "
    "any member of staff, or call the main number and someone will come to meet you.",
    "The river begins as a spring high in the mountains, where the snow melts in early summer. It runs through "
    "pine forests and narrow valleys, gathering streams as it goes, until it reaches the plain. There it widens "
    "and slows, and farms line both banks. By the time it meets the sea it is a mile across, brown with the soil "
    "it has carried for three hundred miles.",
)
_FUNCTIONS: tuple[str, ...] = (
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n"
    "    return width * height\n\n\ndef perimeter(width, height):\n    if width < 0 or height < 0:\n"
    "        raise ValueError('negative size')\n    return 2 * (width + height)\n",
    "def load_config(path):\n    with open(path) as f:\n        lines = f.readlines()\n    config = {}\n"
    "    for line in lines:\n        if '=' in line:\n            key, value = line.split('=', 1)\n"
    "            config[key.strip()] = value.strip()\n    return config\n",
)
# The quote workload: each answer should repeat most of its prompt.
QUOTE_PROMPTS: tuple[str, ...] = (
    *(f"Repeat this passage exactly, word for word:\n\n{p}" for p in _PASSAGES),
    *(f"Repeat this passage, changing only its first word to 'Then':\n\n{p}" for p in _PASSAGES),
    *(f"Repeat this code exactly:\n\n{f}" for f in _FUNCTIONS),
    *(f"Fix the typo in this code and show the whole code:\n\n{f.replace('return', 'retrun', 1)}"
      for f in _FUNCTIONS),
)

# Words for the prefix-cache scenario's long system prompts: common English, a token or two each.
_WORDS: tuple[str, ...] = tuple("""
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door health person
art war history party result change morning reason research girl guy moment air teacher force education
foot boy age policy music market sense nation plan college interest death experience effect class control
care field development role effort rate heart drug show leader light voice wife police mind price report
decision son view relationship town road arm difference value building action model season society tax
director position player record paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image phone data picture practice
""".split())
# 1,000 tokens of the default model's tokenizer (each word is one token) for the scenario's system prompts.
LONG_SYSTEM_PROMPT_WORDS = 991


def long_system_prompt(seed: int, words: int = LONG_SYSTEM_PROMPT_WORDS) -> str:
    """A system prompt of random words, different for every seed, so no cache has seen it before."""
    rng = random.Random(seed)
    return "You are a helpful assistant. Background notes: " + " ".join(rng.choice(_WORDS) for _ in range(words))
