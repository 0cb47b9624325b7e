"""Redraw a `shmcoll bench --json` result without rerunning it: python bench/plot.py in.json out.png"""
import json
import sys

from shmcoll.bench import plot

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
