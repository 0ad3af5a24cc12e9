"""The gym: episodes on a built benchmark's clean or noisy database, scored by the environment.

Imports nothing from Dagster and reads only a benchmark folder (pairs.parquet, overlays.parquet,
staged/).
"""

from pipeline.gym.env import Env, EpisodeError
from pipeline.gym.models import Abstain, Answer, EpisodeState, Flag, Limits, Observation, Python, Sql, Start
from pipeline.gym.recorder import Recorder

__all__ = ["Abstain", "Answer", "Env", "EpisodeError", "EpisodeState", "Flag", "Limits", "Observation", "Python",
           "Recorder", "Sql", "Start"]
