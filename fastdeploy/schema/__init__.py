"""The shared vocabulary every layer may import: requests and their outputs, sampling parameters, the step plan and
runner output between the engine and a model runner, and the messages between an API server and its engine core.

It imports nothing else from fastdeploy, so the engine loop, the runners, the proposer and the HTTP front end can
all depend on it without depending on each other. Nothing here imports paddle.
"""
