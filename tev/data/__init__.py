"""Text the project trains and evaluates on: the standard-library corpus and prompt sets."""
