"""TEV Explorer web app (Gradio). The interactive app is built on top of the `tev` library;
until it lands this entry point explains what is available."""

if __name__ == "__main__":
    print("The TEV Explorer app is not built yet. The library is usable: `python -m tev --help`.")
