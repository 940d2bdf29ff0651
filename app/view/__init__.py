"""What the page shows of a race: token panes, draft strip and stats as HTML, plotly charts, hover
tips, the "inside a cycle" view, the acceptance doctor's report ("Why this tau?"), the speedup
model, the diagrams, the page's prose, and the `Frame` that carries one update of every output.
Reads race state; holds none."""
