"""The router: one HTTP entry point that spreads requests over mixed instances or pairs a prefill with a decode
instance (SERVICES §5, §6). Launch it with ``python -m fastdeploy.router.launch``; it never imports Paddle."""
