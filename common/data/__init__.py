"""Data and sites: what a dataset's name means, its readers (torchvision files, Hugging Face, a site's own folder), the non-IID partitions and one client's local split."""
