"""A small labelled rerank set: each query with one relevant document among unrelated or near-miss ones."""

from __future__ import annotations

from typing import Any

import httpx

# (query, documents, index of the relevant one)
LABELLED: list[tuple[str, list[str], int]] = [
    ("What is the capital of France?",
     ["Bananas are rich in potassium.", "Paris is the capital and largest city of France.",
      "The Rhine flows through Germany.", "Tokyo hosted the Olympics."], 1),
    ("How do I boil an egg?",
     ["Place the egg in boiling water for about nine minutes, then cool it in cold water.",
      "Chickens were domesticated thousands of years ago.", "The stock market fell today.",
      "Eggplant is a purple vegetable."], 0),
    ("Who wrote Romeo and Juliet?",
     ["Verona is a city in northern Italy.", "Charles Dickens wrote Oliver Twist.",
      "William Shakespeare wrote the tragedy Romeo and Juliet.", "Juliet is a common name."], 2),
    ("What causes rain?",
     ["Umbrellas come in many colors.", "Water vapour condenses into droplets that fall from clouds as rain.",
      "Deserts receive little sunlight.", "The train was delayed."], 1),
    ("How many legs does a spider have?",
     ["Spiders have eight legs.", "Insects have six legs.", "A spider web is made of silk.",
      "Octopuses live in the ocean."], 0),
    ("What is the boiling point of water at sea level?",
     ["Ice floats on water.", "The ocean covers most of the Earth.",
      "At sea level, water boils at 100 degrees Celsius.", "Boiling pasta takes ten minutes."], 2),
    ("Which planet is known as the Red Planet?",
     ["Mars is called the Red Planet because of iron oxide on its surface.", "Venus is the hottest planet.",
      "Red wine is made from grapes.", "Jupiter has a great red spot storm."], 0),
    ("How do vaccines work?",
     ["Hospitals have emergency rooms.", "Vaccines train the immune system to recognise a pathogen.",
      "Vacuum cleaners remove dust.", "Viruses are smaller than bacteria."], 1),
    ("What is photosynthesis?",
     ["Cameras take photographs.", "Plants store water in their roots.",
      "Photosynthesis is how plants turn light, water and carbon dioxide into sugar and oxygen.",
      "Synthesizers make electronic music."], 2),
    ("When did World War II end?",
     ["World War II ended in 1945.", "The first world war began in 1914.", "Peace treaties are signed by diplomats.",
      "The Cold War followed decades of tension."], 0),
    ("How do I reset my password?",
     ["Strong passwords mix letters and digits.",
      "Click 'Forgot password' on the sign-in page and follow the emailed link to choose a new one.",
      "The office opens at nine.", "Passports are needed for international travel."], 1),
    ("What do pandas eat?",
     ["Pandas is a Python data analysis library.", "Giant pandas eat mostly bamboo.",
      "Bears hibernate in winter.", "China has many mountains."], 1),
]


def accuracy(base_url: str, path: str, model: str | None = None) -> tuple[float, list[list[float]]]:
    """Share of queries whose relevant document ranks first, and each query's scores in document order."""
    hits, all_scores = 0, []
    for query, docs, relevant in LABELLED:
        body: dict[str, Any] = {"query": query, "documents": docs, **({"model": model} if model else {})}
        r = httpx.post(base_url + path, json=body, timeout=300)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        hits += results[0]["index"] == relevant
        scores = [0.0] * len(docs)
        for row in results:
            scores[row["index"]] = row["relevance_score"]
        all_scores.append(scores)
    return hits / len(LABELLED), all_scores
