"""The "How it works" tab (placeholder until the diagrams land)."""


def howto_html() -> str:
    return "<div>How it works</div>"
