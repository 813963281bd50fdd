"""Output for people: rich console tables (:mod:`.console`) and matplotlib figures
(:mod:`.figures`). These consume Trajectory tables and computed results; they never compute
theory themselves."""
