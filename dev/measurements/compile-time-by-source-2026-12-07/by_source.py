"""Seconds of dynamo's bytecode tracing by file, function and line, from a `TORCH_LOGS=trace_source`
log on stdin: each traced line is charged the time until the next one starts (gaps over 1 s, which
are compiling rather than tracing, are left out).

    python by_source.py < trace.log
"""
import collections
import re
import sys

LINE = re.compile(r"^V\d+ (\d+):(\d+):([\d.]+) .*TRACE starts_line (\S+):(\d+) in (\S+)")
marks = []
for text in sys.stdin:
    if match := LINE.match(text):
        hours, minutes, seconds, path, line, function = match.groups()
        short = path.split("site-packages/")[-1].split("/work/main/")[-1]
        marks.append((int(hours) * 3600 + int(minutes) * 60 + float(seconds), short, function, int(line)))
by_file, by_function, by_line = collections.Counter(), collections.Counter(), collections.Counter()
for (when, path, function, line), (after, *_) in zip(marks, marks[1:]):
    if after - when <= 1:
        by_file[path] += after - when
        by_function[path, function] += after - when
        by_line[path, line, function] += after - when
print(f"traced lines from first to last: {marks[-1][0] - marks[0][0]:.2f} s")
for title, counts in (("by file", by_file), ("by function", by_function), ("by line", by_line)):
    print(title)
    for key, spent in counts.most_common(12):
        print(f"  {spent:6.2f} s  {key}")
