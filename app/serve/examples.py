"""Example prompts offered in the race's settings: one each of math, code, chat and story; the page opens on the first."""

EXAMPLES = [
    [
        (
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? Think step by step."
        )
    ],
    ["Write a Python function `is_prime(n)` that returns True when n is a prime number, with a short docstring."],
    ["What are three good tips for staying focused while studying?"],
    ["Write a short story about a robot who learns to paint the sea."],
]
