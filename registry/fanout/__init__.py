"""Fanning conversions out on job engines that exist: a matrix of models × targets × GPUs (`matrix`), planned into
numbered items with their conversion keys and whether the store has them (`plan`), and written as the documents
each engine runs (`emit`: GitHub Actions, GitLab CI, a Kubernetes Indexed Job, an Argo Workflow). mreg schedules
nothing itself: each item is one `mreg convert --matrix M.toml --item N`, and a conversion key names the work, so an
item run twice, or by two engines, finds the version the first made.
"""
