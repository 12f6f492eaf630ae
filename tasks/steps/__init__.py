"""The steps tasks share to bring a release up and down on one host: preflight, lock,
argv and launcher, wait until ready, smoke, start-up profile, GPU memory, supervision."""
