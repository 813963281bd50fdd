"""A seeded generator of simple English children's stories (the offline default corpus).

Stand-in for TinyStories (gg25 trains on it): every story has a hero, a friend, a treasured
object, a place, a problem and its resolution, told over 8-20 sentences. The same name, pronoun,
object and place come back in later sentences, so a masked word is often predictable only from
context several sentences away (the long-range structure MLM has to learn); function words,
quotes and pronoun agreement give the short-range structure. The grammar and the word lists are
written here; the vocabulary is about 1,100 distinct words (:func:`vocabulary`).

``generate_stories(n, seed)`` is deterministic in ``seed`` (Python's ``random.Random``).
"""

from __future__ import annotations

import random

# name -> pronoun kind (s = she/her, h = he/his)
_GIRLS = ("Lily Mia Sue Anna Zoe Emma Lucy Ella Rose Amy Kate Grace Chloe Ruby Daisy Molly Sara "
          "Nora Ivy Hannah Julia Alice Clara Maya Leah Stella Hazel Eva Olive Bella Luna Jane "
          "Kim Tess Fay Gina Holly June Lola Abby Beth Cora Dora Erin Fiona Gwen Iris Jade "
          "Kara Lena Mona Nina Opal Pia Rita Tina Uma Vera Wendy").split()
_BOYS = ("Tom Max Ben Sam Leo Jack Tim Finn Noah Luke Owen Jake Dan Eli Hugo Ryan Adam Alex "
         "Toby Oscar Henry Milo Theo Ollie Joe Pete Ned Carl Ivan Zack Nick Rob Ted Will Kai Bob "
         "Dave Fred Gus Hank Arlo Benny Chad Dylan Ezra Felix Gabe Harry Isaac Jonah Kevin "
         "Liam Mark Nathan Omar Paul Quinn Ray Simon Victor").split()
_KIDS = "girl boy child kid".split()
ANIMALS = ("cat dog bird fish frog duck bunny bear fox owl mouse pig cow horse sheep goat lion "
           "tiger monkey elephant giraffe zebra turtle snake squirrel deer wolf puppy kitten "
           "chick hen rooster goose swan crab whale dolphin seal penguin bee butterfly ant "
           "ladybug spider snail worm bat hamster parrot pony donkey camel kangaroo koala "
           "panda raccoon mole hedgehog beaver otter lamb calf").split()
OBJECTS = ("ball box kite cake book hat toy boat cup apple flower car drum shoe bed doll train "
           "truck robot block puzzle crayon pencil brush paint bucket shovel spoon bowl plate "
           "blanket pillow sock coat scarf glove ring necklace bracelet key lamp clock bell "
           "whistle balloon bubble rock shell feather leaf stick stone coin button ribbon "
           "bag basket map letter picture card gift box jar bottle wagon bike sled swing "
           "slide rope ladder tent flag star cookie candy pie sandwich banana orange pear "
           "peach cherry grape lemon carrot potato tomato egg bread cheese soup milk juice tea "
           "honey jam muffin cupcake pizza noodle umbrella backpack helmet mask crown wand "
           "guitar piano flute trumpet violin camera phone watch mirror comb broom hammer "
           "nail saw magnet marble kazoo yoyo teddy dinosaur rocket plane helicopter "
           "bicycle scooter skateboard fan button bead blocks chalk crayons glue tape "
         "scissors paper envelope stamp sticker badge medal trophy cushion quilt towel soap "
         "sponge bucket net fishing kettle pot pan fork knife napkin candle lantern torch "
         "compass telescope globe chest treasure pebble acorn pinecone seed sprout pumpkin "
         "melon berry nut walnut chestnut carrot cabbage").split()
PLACES = ("park garden house forest school beach lake farm room hill river pond field meadow "
          "city town village castle zoo store market library kitchen yard street bridge cave "
          "mountain island jungle desert playground barn nest tower shop bakery "
          "museum circus fair hospital station harbor camp valley orchard pool attic "
          "basement classroom backyard treehouse cottage palace igloo lighthouse windmill "
          "greenhouse stable pier swamp canyon glacier volcano prairie woods creek "
          "waterfall tunnel ship garage porch").split()
NATURE = ("tree bush rock log hole puddle flower fence wall bench table chair bed door "
          "window box stone hill cloud").split()
ADJS = ("big small red blue happy sad old new shiny soft funny green little kind brave sleepy "
        "pretty tiny huge tall short long round square fluffy fuzzy smooth rough bright dark "
        "warm cold hot cool wet dry clean dirty quiet loud gentle silly smart clever wise "
        "shy proud busy lazy strong weak fast slow yummy sweet sour salty spicy fresh sticky "
        "heavy light empty full broken special magic secret strange lovely nice good bad "
        "best beautiful colorful golden silver wooden purple pink yellow orange white black "
        "brown gray striped spotted curly friendly grumpy noisy careful curious hungry "
        "thirsty lonely cheerful playful wild tame young messy neat cozy sparkly bumpy "
        "crunchy creamy crispy juicy smelly stinky tasty dusty muddy sandy rocky icy snowy "
        "windy rainy sunny cloudy foggy stormy shady sleek glossy shaggy hairy bald skinny "
        "chubby plump slim giant mini enormous little delicate fragile sturdy solid hollow "
        "deep shallow narrow wide steep flat crooked straight tidy jolly merry glad "
        "polite rude honest helpful patient grateful generous humble mighty fierce "
        "timid bold graceful clumsy wobbly jumpy bouncy squishy slimy spiky prickly").split()
COLORS = "red blue green yellow purple pink orange white black brown gray golden silver".split()
FEEL = ("happy sad scared proud tired excited angry surprised glad worried calm sorry "
        "nervous grateful jealous bored cheerful curious lonely upset thankful hopeful "
        "shy brave silly sleepy grumpy confused amazed").split()
FAMILY = "mom dad grandma grandpa sister brother aunt uncle cousin teacher".split()
# (base, past) verb pairs that take an object
TRANS = [tuple(p.split("/")) for p in (
    "find/found see/saw like/liked want/wanted take/took make/made lose/lost have/had "
    "hug/hugged hold/held carry/carried throw/threw catch/caught kick/kicked push/pushed "
    "pull/pulled share/shared fix/fixed paint/painted draw/drew build/built open/opened "
    "close/closed wash/washed clean/cleaned hide/hid fill/filled drop/dropped touch/touched "
    "bring/brought buy/bought sell/sold give/gave keep/kept watch/watched love/loved "
    "chase/chased follow/followed help/helped visit/visited count/counted pick/picked "
    "smell/smelled taste/tasted eat/ate drink/drank read/read bake/baked wrap/wrapped "
    "decorate/decorated polish/polished borrow/borrowed return/returned lift/lifted "
    "drag/dragged roll/rolled kiss/kissed pat/patted tickle/tickled feed/fed grow/grew "
    "plant/planted water/watered cut/cut fold/folded sew/sewed knit/knitted color/colored "
    "stack/stacked sort/sorted shake/shook squeeze/squeezed toss/tossed grab/grabbed "
    "save/saved guard/guarded miss/missed ride/rode").split()]
# (base, past) verbs without an object
INTRANS = [tuple(p.split("/")) for p in (
    "run/ran jump/jumped sing/sang dance/danced swim/swam climb/climbed laugh/laughed "
    "cry/cried sleep/slept play/played walk/walked skip/skipped hop/hopped fly/flew "
    "dig/dug rest/rested smile/smiled shout/shouted whisper/whispered wait/waited "
    "look/looked listen/listened giggle/giggled clap/clapped spin/spun roll/rolled "
    "splash/splashed wiggle/wiggled nap/napped explore/explored bounce/bounced "
    "crawl/crawled dive/dove float/floated march/marched race/raced slide/slid "
    "stretch/stretched sneeze/sneezed yawn/yawned hum/hummed whistle/whistled "
    "tiptoe/tiptoed wander/wandered paddle/paddled").split()]
ADVS = ("slowly quickly happily sadly gently quietly loudly carefully softly bravely "
        "proudly sleepily suddenly finally together again eagerly calmly kindly politely "
        "patiently merrily cheerfully quickly nervously wildly freely lazily busily "
        "silently").split()
TIMES = ("day morning afternoon evening night summer winter spring autumn weekend").split()
WEATHER = "sunny rainy windy snowy cloudy foggy stormy warm".split()
FOODS = ("apples bananas berries grapes cherries carrots peas beans corn rice noodles soup "
         "bread toast cheese eggs pancakes waffles cookies muffins cake pie pizza "
         "sandwiches salad porridge oatmeal yogurt honey jam butter popcorn pretzels "
         "crackers fish chicken potatoes tomatoes cucumbers plums peaches pears lemonade "
         "milk juice cocoa tea icecream candy chocolate donuts biscuits dumplings").split()
BODY = ("eyes nose ears hands feet head arms legs tummy knees fingers toes hair cheeks "
        "tail paws wings nose").split()
NUMBERS = "two three four five six seven eight nine ten many".split()
MEALS = "breakfast lunch dinner snack supper".split()
MORALS = ("sharing is good", "friends help each other", "it is good to be kind",
          "being brave is not easy but it is worth it", "you should always say sorry",
          "it is fun to try new things", "patience is important", "you should be careful",
          "telling the truth is best", "hard work pays off", "everyone is special",
          "it is good to listen to others")


class _Cast:
    """The entities of one story; sentences refer back to them."""

    def __init__(self, r: random.Random):
        self.r = r
        girl = r.random() < 0.5
        self.hero = r.choice(_GIRLS if girl else _BOYS)
        self.he, self.his = ("she", "her") if girl else ("he", "his")
        self.kind = r.choice(["girl" if girl else "boy"] * 20 + _KIDS[2:] + list(ANIMALS))
        fgirl = r.random() < 0.5
        self.friend = r.choice([n for n in (_GIRLS if fgirl else _BOYS) if n != self.hero])
        self.fhe = "she" if fgirl else "he"
        self.fkind = r.choice(ANIMALS) if r.random() < 0.5 else ("girl" if fgirl else "boy")
        self.obj = r.choice(OBJECTS)
        self.color = r.choice(COLORS)
        self.adj = r.choice(ADJS)
        self.place = r.choice(PLACES)
        self.home = r.choice(("house", "home", "nest", "hole", "tree", "village", "farm"))
        self.family = r.choice(FAMILY)
        self.spot = r.choice(NATURE)
        self.feel = r.choice(FEEL)
        self.verb = r.choice(INTRANS)


def _opening(c: _Cast) -> list[str]:
    r = c.r
    k = r.randrange(3)
    if k == 0:
        s = f"Once upon a time, there was a {r.choice(ADJS)} {c.kind} named {c.hero}."
    elif k == 1:
        s = (f"One {r.choice(WEATHER)} {r.choice(TIMES)}, a {r.choice(ADJS)} {c.kind} "
             f"named {c.hero} woke up in {c.his} {r.choice(ADJS)} {c.home}.")
    else:
        s = f"{c.hero} was a {r.choice(ADJS)} little {c.kind} who lived near the {c.place}."
    rest = [f"{c.hero} loved to {c.verb[0]} {r.choice(ADVS)}.",
            f"{c.he.capitalize()} had a {c.color} {c.obj} that {c.he} liked very much.",
            f"Every {r.choice(TIMES)}, {c.hero} and {c.his} {c.family} went to the {c.place}."]
    r.shuffle(rest)
    return [s] + rest[: 1 + r.randrange(3)]


def _middle(c: _Cast) -> list[str]:
    r = c.r
    verb = r.choice(TRANS)
    out = [f"One {r.choice(TIMES)}, {c.hero} took the {c.color} {c.obj} to the {c.place}.",
           f"At the {c.place}, {c.hero} met a {r.choice(ADJS)} {c.fkind} named {c.friend}.",
           f'{c.friend} said, "Hello, {c.hero}! Can I play with your {c.obj}?"']
    if r.random() < 0.5:
        out.append(f'{c.hero} said, "Yes, let us {verb[0]} the {c.obj} together!"')
        out.append(f"They {verb[1]} the {c.obj} and {c.verb[1]} {r.choice(ADVS)}.")
    else:
        out.append(f'{c.hero} said, "No, it is my {c.obj}!"')
        out.append(f"{c.friend} felt {r.choice(FEEL)} and {r.choice(INTRANS)[1]} away.")
    trouble = r.randrange(4)
    if trouble == 0:
        out.append(f"Then the {c.obj} fell into a {r.choice(ADJS)} {c.spot}.")
    elif trouble == 1:
        out.append(f"Suddenly, a {r.choice(ADJS)} {r.choice(ANIMALS)} took the {c.obj} "
                   f"and ran behind the {c.spot}.")
    elif trouble == 2:
        out.append(f"But the {c.obj} got stuck on top of the {c.spot}.")
    else:
        out.append(f"Oh no! The {c.color} {c.obj} broke into {r.choice(('two', 'three'))} "
                   "pieces.")
    out.append(f"{c.hero} felt {c.feel}.")
    if r.random() < 0.5:
        out.insert(2, f"There were {r.choice(NUMBERS)} {r.choice(ANIMALS)}s near the "
                      f"{r.choice(NATURE)}, and the sky was {r.choice(WEATHER)}.")
    if r.random() < 0.5:
        out.insert(-1, f"For {r.choice(MEALS)}, they ate {r.choice(FOODS)} and "
                       f"{r.choice(FOODS)} under a {r.choice(ADJS)} {r.choice(NATURE)}.")
    if r.random() < 0.5:
        out.append(f"{c.hero} rubbed {c.his} {r.choice(BODY)} and {r.choice(INTRANS)[1]} "
                   f"{r.choice(ADVS)}.")
    if r.random() < 0.6:
        out.append(f'"I want my {c.obj} back," {c.hero} said to {c.his} {c.family}.')
    return out


def _ending(c: _Cast) -> list[str]:
    r = c.r
    out = [f"{c.friend} wanted to help {c.hero}.",
           f"{c.fhe.capitalize()} {r.choice(('looked', 'searched', 'climbed', 'dug'))} "
           f"near the {c.spot} and found the {c.obj}.",
           f"{c.hero} was very {r.choice(('happy', 'glad', 'grateful', 'thankful'))}.",
           f'{c.hero} said, "Thank you, {c.friend}! You are a {r.choice(ADJS)} friend."']
    k = r.randrange(3)
    if k == 0:
        out.append(f"From that day on, {c.hero} and {c.friend} were best friends.")
    elif k == 1:
        out.append(f"They played with the {c.obj} at the {c.place} every {r.choice(TIMES)}.")
    else:
        out.append(f"{c.hero} shared the {c.obj} with {c.friend} and they "
                   f"{r.choice(INTRANS)[1]} {r.choice(ADVS)}.")
    if r.random() < 0.4:
        out.append(f"{c.hero} learned that {r.choice(MORALS)}.")
    if r.random() < 0.5:
        out.append(f"That night, {c.hero} went to sleep with the {c.obj} next to "
                   f"{c.his} bed.")
    return out


def story(r: random.Random) -> str:
    """One story drawn with the generator ``r``."""
    c = _Cast(r)
    return " ".join(_opening(c) + _middle(c) + _ending(c))


def generate_stories(n: int, seed: int = 0) -> list[str]:
    """``n`` stories, deterministic in ``seed``; different seeds give different stories."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    r = random.Random(f"sigprop-stories-{int(seed)}")
    return [story(r) for _ in range(n)]


def vocabulary() -> set[str]:
    """Every word the generator can emit (lower-cased, punctuation stripped)."""
    words: set[str] = set()
    groups = (_GIRLS, _BOYS, _KIDS, ANIMALS, OBJECTS, PLACES, NATURE, ADJS, COLORS, FEEL,
              FAMILY, ADVS, TIMES, WEATHER, FOODS, BODY, NUMBERS, MEALS,
              [w for p in TRANS + INTRANS for w in p],
              [w for m in MORALS for w in m.split()])
    for g in groups:
        words.update(w.lower() for w in g)
    return words
