"""The live scheduler service: the engine (``core``) behind a REST API, with persistence
(:mod:`.store`), launch backends (:mod:`.launcher`) and hub authentication (:mod:`.auth`)."""
