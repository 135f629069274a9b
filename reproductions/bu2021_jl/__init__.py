"""Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat 2021 (arXiv 2102.03013): DP-SGD-JL.

Figure 3 (:mod:`.epsilon_vs_epochs`), Table 2 (:mod:`.speed`), Tables 3-4 (:mod:`.memory`),
Figure 4 (:mod:`.accuracy`) and a Figure 1-style summary (:mod:`.summary`).
"""
